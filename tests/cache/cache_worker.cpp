// kiln_cache_worker: one simulated engine process for the multi-process cache tests. It talks to the test
// over stdin/stdout, one line per step, so the test decides every interleaving point (no sleeps):
//
//   kiln_cache_worker tune DIR ID PROBLEMS CHOICES
//     prints "ready writer|reader", waits for "go", tunes PROBLEMS x CHOICES (overlapping with every other
//     worker), prints "done WRITTEN FOUND" (entries it wrote, and entries another process had written before
//     it measured them); on "sync" syncs and prints "synced"; on "report" refreshes and prints
//     "report <hash of all decisions> <decisions> <timings> <binaries ok> <invalid>"; on "exit" closes.
//   kiln_cache_worker write DIR FIRST writer|auto
//     opens as the writer (or as whatever role is free), writes entries FIRST, FIRST+1, ... forever, printing "begin K" before and "ack K" after each entry
//     (a timing, a 256 KiB binary, a decision), and "flush K" before flushing every fourth; the test kills
//     it with SIGKILL at a line of its choosing.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "kiln/cache/store.h"
#include "kiln/cache/tuning.h"
#include "worker_entries.h"

using namespace kiln;
using namespace kiln::cache;

namespace {

void say(const std::string& line) {
  std::string s = line + "\n";
  // Unbuffered: a line the test has read was really printed before whatever follows it.
  (void)!::write(1, s.data(), s.size());
}

std::string expect_line() {
  std::string line;
  if (!std::getline(std::cin, line)) std::exit(3);
  return line;
}

[[noreturn]] void fail(const std::string& what) {
  say("error " + what);
  std::exit(2);
}

int tune(const std::string& dir, int id, int problems, int choices) {
  StoreOptions o;
  o.dir = dir;
  auto opened = TuningCache::open(TuneMode::kTune, o);
  if (!opened.ok()) fail(opened.status().to_string());
  auto& tc = *opened;
  say(tc->store()->is_writer() ? "ready writer" : "ready reader");
  if (expect_line() != "go") fail("expected go");
  int written = 0, found = 0;
  for (int i = 0; i < problems; ++i) {
    int p = (i + id * 5) % problems;  // each worker starts elsewhere: their writes overlap in time
    std::string problem = test_worker::problem(p);
    for (int c = 0; c < choices; ++c) {
      std::string choice = test_worker::choice(c);
      if (!tc->should_measure(problem, choice)) {
        found += 2;  // another process's timing, already here (the writer ingests readers' entries as they come)
        continue;
      }
      if (auto s = tc->record_binary(test_worker::binary(p, c, 2048)); !s.ok()) fail(s.to_string());
      TimingRecord t;
      t.problem = problem;
      t.choice = choice;
      t.median_us = test_worker::microseconds(p, c, id);
      t.samples = 10;
      if (auto s = tc->record_timing(t); !s.ok()) fail(s.to_string());
      written += 2;
    }
    const TimingRecord* best = nullptr;
    auto all = tc->timings(problem);
    for (const auto& t : all) {
      if (!best || t.median_us < best->median_us) best = &t;
    }
    Decision d;
    d.problem = problem;
    d.choice = best->choice;
    d.median_us = best->median_us;
    d.kernel = test_worker::binary(p, std::stoi(best->choice.substr(1)), 16).key;
    if (auto s = tc->record_decision(d); !s.ok()) fail(s.to_string());
    ++written;
  }
  say(fmt::format("done {} {}", written, found));
  Store& store = *tc->store();
  while (true) {
    std::string cmd = expect_line();
    if (cmd == "sync") {
      if (auto s = store.sync(); !s.ok()) fail(s.to_string());
      say("synced");
    } else if (cmd == "report") {
      if (auto s = store.refresh(); !s.ok()) fail(s.to_string());
      auto summary = test_worker::summarize(store, problems, choices);
      say(fmt::format("report {:016x} {} {} {} {}", summary.hash, summary.decisions, summary.timings,
                      summary.binaries_ok, summary.invalid));
    } else if (cmd == "exit") {
      return 0;
    } else {
      fail("unknown command " + cmd);
    }
  }
}

int write_forever(const std::string& dir, int first, const std::string& role) {
  StoreOptions o;
  o.dir = dir;
  o.role = role == "writer" ? Role::kWriter : Role::kAuto;
  auto opened = Store::open(o);
  if (!opened.ok()) fail(opened.status().to_string());
  Store& store = **opened;
  say(store.is_writer() ? "ready writer" : "ready reader");
  for (int k = first;; ++k) {
    say(fmt::format("begin {}", k));
    for (auto& e : test_worker::kill_entry(k)) {
      Status s = std::visit([&](auto& v) { return test_worker::put(store, v); }, e);
      if (!s.ok()) fail(s.to_string());
    }
    say(fmt::format("ack {}", k));
    if (k % 4 == 3) {
      say(fmt::format("flush {}", k));
      if (auto s = store.flush(); !s.ok()) fail(s.to_string());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "tune" && argc == 6) return tune(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (mode == "write" && argc == 5) return write_forever(argv[2], std::atoi(argv[3]), argv[4]);
  std::fprintf(stderr, "usage: kiln_cache_worker tune DIR ID PROBLEMS CHOICES | write DIR FIRST writer|auto\n");
  return 2;
}
