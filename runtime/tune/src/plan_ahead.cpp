#include "kiln/runtime/plan_ahead.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "kiln/pool/gate.h"

namespace kiln::runtime {

PlanAhead::PlanAhead(PrecompileGate& gate, size_t problems, PlanFn plan, Options options)
    : gate_(gate), plan_(std::move(plan)), options_(options), slots_(problems) {
  if (!slots_.empty()) thread_ = std::thread([this] { run(); });  // a warm start plans nothing: no thread
}

PlanAhead::PlanAhead(Tuner& tuner, const std::vector<Problem>& problems, Options options)
    : PlanAhead(tuner.gate(), problems.size(), [&tuner, problems](size_t i) { return tuner.plan_ahead(problems[i]); },
                options) {}

PlanAhead::~PlanAhead() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Slot& s : slots_) {
    for (auto& f : s.requests) f.cancel();
  }
}

void PlanAhead::tuned(size_t i) {
  std::vector<Future<Binaries>> withdrawn;
  std::vector<KernelKey> raise;
  {
    std::lock_guard lock(mu_);
    if (i >= slots_.size() || slots_[i].done) return;
    slots_[i].done = true;
    withdrawn = std::move(slots_[i].requests);
    slots_[i].requests.clear();
    const size_t later = i + static_cast<size_t>(std::max(0, options_.replan));
    if (options_.replan > 0 && later < slots_.size()) replans_.push_back(later);
    next_tune_ = std::max(next_tune_, i + 1);
    raise = window_kernels();
  }
  cv_.notify_all();
  for (auto& f : withdrawn) f.cancel();
  promote(raise);
}

std::vector<KernelKey> PlanAhead::window_kernels() const {
  std::vector<KernelKey> out;
  const size_t end = std::min(slots_.size(), next_tune_ + static_cast<size_t>(std::max(0, options_.promote)));
  for (size_t j = next_tune_; j < end; ++j) {
    if (!slots_[j].done) out.insert(out.end(), slots_[j].kernels.begin(), slots_[j].kernels.end());
  }
  return out;
}

void PlanAhead::promote(const std::vector<KernelKey>& kernels) {
  // Each raise queues behind what is at normal priority already, so raising the window in order each time keeps
  // the window's compiles in problem order (a compile raised before is at normal already and stays put).
  for (const KernelKey& k : kernels) gate_.raise(k, Priority::kNormal);
}

std::vector<std::string> PlanAhead::requested(size_t i) const {
  std::lock_guard lock(mu_);
  return i < slots_.size() ? slots_[i].names : std::vector<std::string>{};
}

std::vector<std::string> PlanAhead::pending(size_t i) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  if (i >= slots_.size()) return out;
  const Slot& s = slots_[i];
  for (size_t k = 0; k < s.requests.size(); ++k) {
    if (!s.requests[k].ready()) out.push_back(s.names[k]);
  }
  return out;
}

void PlanAhead::wait_idle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return stop_ || (!busy_ && replans_.empty() && next_first_ >= slots_.size()); });
}

int PlanAhead::failed_plans() const {
  std::lock_guard lock(mu_);
  return failed_;
}

void PlanAhead::run() {
  for (;;) {
    size_t i = 0;
    {
      std::unique_lock lock(mu_);
      busy_ = false;
      idle_cv_.notify_all();
      cv_.wait(lock, [&] { return stop_ || !replans_.empty() || next_first_ < slots_.size(); });
      if (stop_) return;
      // A re-plan is due soonest (its tune is `replan` problems away); one the first pass has not reached yet
      // is moot, since that pass plans with what the cache knows by then.
      bool found = false;
      while (!replans_.empty() && !found) {
        i = replans_.front();
        replans_.pop_front();
        found = slots_[i].planned && !slots_[i].done;
      }
      while (!found && next_first_ < slots_.size()) {
        i = next_first_++;
        found = !slots_[i].done;
      }
      if (!found) continue;
      busy_ = true;
    }
    plan_one(i);
  }
}

void PlanAhead::plan_one(size_t i) {
  Result<PlannedChoices> planned = plan_(i);
  if (!planned.ok()) {
    spdlog::debug("kiln: planning ahead of problem {}: {}", i, planned.status().to_string());
    std::lock_guard lock(mu_);
    ++failed_;
    slots_[i].planned = true;
    return;
  }
  std::vector<std::string> known;
  {
    std::lock_guard lock(mu_);
    known = slots_[i].names;
  }
  std::vector<std::string> names;
  std::vector<Future<Binaries>> requests;
  std::vector<KernelKey> kernels;
  auto request = [&](const ChoicePtr& c, Priority priority) {
    if (!c || std::find(known.begin(), known.end(), c->name()) != known.end()) return;
    if (std::find(names.begin(), names.end(), c->name()) != names.end()) return;
    names.push_back(c->name());
    requests.push_back(c->precompile(gate_, priority, QueueOrder::kSubmission, options_.promote > 0 ? &kernels : nullptr));
  };
  for (const auto& c : planned->first) request(c, Priority::kBackground);
  if (options_.speculate) {
    for (const auto& c : planned->widening) request(c, Priority::kSpeculative);
  }
  bool moot = false;
  std::vector<KernelKey> raise;
  {
    std::lock_guard lock(mu_);
    Slot& s = slots_[i];
    s.planned = true;
    moot = s.done;  // tuned while this plan ran: nobody waits for these
    if (!moot) {
      s.names.insert(s.names.end(), names.begin(), names.end());
      for (auto& f : requests) s.requests.push_back(std::move(f));
      s.kernels.insert(s.kernels.end(), kernels.begin(), kernels.end());
      // In the window already (the first problems, a re-plan): raised now, behind the window's earlier problems.
      if (i >= next_tune_ && i < next_tune_ + static_cast<size_t>(std::max(0, options_.promote))) raise = std::move(kernels);
    }
  }
  if (moot) {
    for (auto& f : requests) f.cancel();
  }
  promote(raise);
}

UndecidedProblems undecided_problems(const Tuner& tuner, const std::vector<Problem>& workload,
                                     const std::vector<size_t>& order) {
  UndecidedProblems out;
  out.index.assign(workload.size(), -1);
  auto consider = [&](size_t i) {
    if (i >= workload.size() || out.index[i] >= 0) return;
    auto decided = tuner.cache().lookup_decision(tuner.key(workload[i]));
    if (decided.ok() && *decided) return;
    out.index[i] = static_cast<std::ptrdiff_t>(out.problems.size());
    out.problems.push_back(workload[i]);
  };
  if (order.empty()) {
    for (size_t i = 0; i < workload.size(); ++i) consider(i);
  } else {
    for (size_t i : order) consider(i);
  }
  return out;
}

}  // namespace kiln::runtime
