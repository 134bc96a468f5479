// Build claims: lease files under <cache>/claims, one per kernel key being built (see build_claims.h and
// docs/cache.md). Every claim file is written whole aside and then linked or renamed into place, so a reader
// never sees half a claim; everything that replaces or removes another process's claim runs under
// claims/.lock, re-reading the claim first, so that two processes never take over the same claim.
#include "kiln/cache/build_claims.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "file_lock.h"

namespace kiln::cache {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMagic = "kiln-claim 1";

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// One line per field: a message or compile log keeps its newlines escaped.
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      out += s[i + 1] == 'n' ? '\n' : s[i + 1];
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The start time (clock ticks since boot) of `pid` from /proc/<pid>/stat, or 0 when there is no such process.
uint64_t process_start_time(int64_t pid) {
  std::string stat = read_small_file(fmt::format("/proc/{}/stat", pid));
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

bool process_alive(const ClaimOwner& owner) {
  const uint64_t start = process_start_time(owner.pid);
  if (start == 0) return false;
  return owner.start_time == 0 || owner.start_time == start;
}

uint64_t random_nonce() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t r = (uint64_t(rd()) << 32) ^ rd();
  return r ^ (uint64_t(::getpid()) << 40) ^ counter.fetch_add(0x9e3779b97f4a7c15ull);
}

enum class State { kBuilding, kBuilt, kFailed };
std::string_view state_name(State s) {
  switch (s) {
    case State::kBuilding: return "building";
    case State::kBuilt: return "built";
    case State::kFailed: return "failed";
  }
  return "?";
}

// One claim file's content.
struct Record {
  State state = State::kBuilding;
  ClaimOwner owner;
  uint64_t nonce = 0;
  int64_t expires_ms = 0;
  int code = 0;
  std::string message, detail;
};

std::string encode(const Record& r) {
  std::string out = fmt::format("{}\nstate {}\nhost {}\nboot {}\npid {}\nstart {}\nnonce {:016x}\nexpires {}\n", kMagic,
                                state_name(r.state), r.owner.host_id, r.owner.boot_id, r.owner.pid,
                                r.owner.start_time, r.nonce, r.expires_ms);
  if (r.state == State::kFailed) {
    out += fmt::format("code {}\nmessage {}\ndetail {}\n", r.code, escape(r.message), escape(r.detail));
  }
  return out;
}

// nullopt for text that is no claim (damaged, or written by something else): such a file counts as expired.
std::optional<Record> decode(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kMagic) return std::nullopt;
  Record r;
  bool has_state = false, has_expiry = false;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    const std::string name = line.substr(0, sp);
    const std::string value = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (name == "state") {
      has_state = true;
      if (value == "building") r.state = State::kBuilding;
      else if (value == "built") r.state = State::kBuilt;
      else if (value == "failed") r.state = State::kFailed;
      else return std::nullopt;
    } else if (name == "host") {
      r.owner.host_id = value;
    } else if (name == "boot") {
      r.owner.boot_id = value;
    } else if (name == "pid") {
      r.owner.pid = std::strtoll(value.c_str(), nullptr, 10);
    } else if (name == "start") {
      r.owner.start_time = std::strtoull(value.c_str(), nullptr, 10);
    } else if (name == "nonce") {
      r.nonce = std::strtoull(value.c_str(), nullptr, 16);
    } else if (name == "expires") {
      has_expiry = true;
      r.expires_ms = std::strtoll(value.c_str(), nullptr, 10);
    } else if (name == "code") {
      r.code = std::atoi(value.c_str());
    } else if (name == "message") {
      r.message = unescape(value);
    } else if (name == "detail") {
      r.detail = unescape(value);
    }
  }
  if (!has_state || !has_expiry) return std::nullopt;
  return r;
}

bool same_owner(const ClaimOwner& a, const ClaimOwner& b) {
  return a.host_id == b.host_id && a.boot_id == b.boot_id && a.pid == b.pid && a.start_time == b.start_time;
}

bool is_key_name(std::string_view name) {
  if (name.size() != 32) return false;
  for (char c : name) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status io_error(std::string_view what, const std::string& path) {
  return make_error(ErrorCode::kIoError, fmt::format("build claims: cannot {} '{}': {}", what, path, std::strerror(errno)));
}

}  // namespace

std::string ClaimOwner::describe() const {
  std::string host = host_id.substr(0, host_id.find('/'));
  if (host.size() > 12) host = host.substr(0, 12);
  return fmt::format("pid {} on {}", pid, host);
}

ClaimOwner ClaimOwner::current() {
  ClaimOwner o;
  std::string machine = trim(read_small_file("/etc/machine-id"));
  if (machine.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    machine = name;
  }
  // Two containers on one host can share the machine id but not their pids: the pid namespace is part of
  // the host's identity, so a pid is only ever judged within the namespace it belongs to.
  std::error_code ec;
  const std::string pidns = fs::read_symlink("/proc/self/ns/pid", ec).string();
  o.host_id = machine + "/" + (ec ? std::string("?") : pidns);
  o.boot_id = trim(read_small_file("/proc/sys/kernel/random/boot_id"));
  o.pid = ::getpid();
  o.start_time = process_start_time(o.pid);
  return o;
}

std::string claims_dir(const std::string& cache_dir) { return (fs::path(cache_dir) / "claims").string(); }

struct ClaimDir::Impl {
  ClaimOptions opt;
  ClaimOwner self;
  std::string lock_path;

  struct Held {
    uint64_t nonce = 0;
    int64_t renewed_ms = 0;
  };
  mutable std::mutex mu;
  std::unordered_map<KernelKey, Held> held;
  ClaimCounters counters;
  std::atomic<uint64_t> tmp_seq{0};

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread renewer;

  int64_t now() const {
    if (opt.now_ms) return opt.now_ms();
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  bool alive(const ClaimOwner& o) const { return opt.is_alive ? opt.is_alive(o) : process_alive(o); }
  std::string path_of(const KernelKey& key) const { return (fs::path(opt.dir) / key.hex()).string(); }

  std::string write_aside(const std::string& text, Status& st) {
    std::string tmp = (fs::path(opt.dir) / fmt::format(".tmp-{}-{:x}-{}", self.pid, random_nonce() & 0xffffffff,
                                                         tmp_seq.fetch_add(1)))
                          .string();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      st = io_error("create a claim in", opt.dir);
      return {};
    }
    const ssize_t n = ::write(fd, text.data(), text.size());
    const bool ok = n == static_cast<ssize_t>(text.size());
    if (!ok) st = io_error("write", tmp);
    ::close(fd);
    if (!ok) {
      ::unlink(tmp.c_str());
      return {};
    }
    return tmp;
  }

  // Creates `path` holding `r` if no file has that name: true when created, false when one exists.
  Result<bool> publish_new(const std::string& path, const Record& r) {
    Status st;
    const std::string tmp = write_aside(encode(r), st);
    if (!st.ok()) return st;
    bool created = ::link(tmp.c_str(), path.c_str()) == 0;
    int err = created ? 0 : errno;
    if (!created && err != EEXIST) {
      // NFS: the link may have happened although its reply was lost; the link count says.
      struct stat s{};
      if (::stat(tmp.c_str(), &s) == 0 && s.st_nlink == 2) created = true;
    }
    ::unlink(tmp.c_str());
    if (!created && err != EEXIST) {
      errno = err;
      return io_error("create", path);
    }
    return created;
  }

  // Replaces `path` (ours, checked by the caller under the lock) with `r`.
  Status replace(const std::string& path, const Record& r) {
    Status st;
    const std::string tmp = write_aside(encode(r), st);
    if (!st.ok()) return st;
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      Status e = io_error("replace", path);
      ::unlink(tmp.c_str());
      return e;
    }
    return Status();
  }

  // nullopt: no such file. A file that is no claim reads as an expired one (so it is taken over and replaced).
  std::optional<Record> read(const std::string& path) const {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, n);
    ::close(fd);
    if (auto r = decode(text)) return r;
    Record junk;
    junk.state = State::kBuilding;
    junk.expires_ms = 0;
    junk.owner.host_id = "(unreadable claim)";
    return junk;
  }

  // The dir lock, tried a few times: it is only ever held for a read and a write, and a claim that cannot get it
  // now is retried by its caller later, so no process ever waits long on another.
  std::optional<FileLock> lock_dir() {
    for (int attempt = 0; attempt < 50; ++attempt) {
      auto l = FileLock::acquire(lock_path, false);
      if (l.ok()) return std::move(*l);
      if (l.status().code() != ErrorCode::kUnavailable) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return std::nullopt;
  }

  // Whether a claim no longer counts: its lease (or its built/failed record) ran out, or its builder died.
  bool stale(const Record& r, int64_t t) const {
    const bool other_host = r.owner.host_id != self.host_id;
    const int64_t margin = other_host ? opt.clock_skew.count() : 0;
    if (t > r.expires_ms + margin) return true;
    if (r.state != State::kBuilding || other_host) return false;
    if (r.owner.boot_id != self.boot_id) return true;  // the host rebooted since: its builder is gone
    if (same_owner(r.owner, self)) return false;       // our own (another thread's claim of this process)
    return !alive(r.owner);
  }

  Record fresh_record(int64_t t) const {
    Record r;
    r.owner = self;
    r.nonce = random_nonce();
    r.expires_ms = t + opt.lease.count();
    return r;
  }
};

ClaimDir::ClaimDir(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ClaimDir::~ClaimDir() {
  {
    std::lock_guard lock(impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->renewer.joinable()) impl_->renewer.join();
  for (const KernelKey& k : held()) (void)release(k, Outcome::kAbandoned);
}

Result<std::unique_ptr<ClaimDir>> ClaimDir::open(ClaimOptions options) {
  if (options.dir.empty()) return make_error(ErrorCode::kInvalidArgument, "ClaimOptions::dir is required");
  if (options.lease.count() <= 0) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("build claim lease {} ms is not positive", options.lease.count()));
  }
  auto impl = std::make_unique<Impl>();
  impl->self = options.self ? *options.self : ClaimOwner::current();
  impl->opt = std::move(options);
  impl->lock_path = (fs::path(impl->opt.dir) / ".lock").string();
  std::error_code ec;
  fs::create_directories(impl->opt.dir, ec);
  if (ec) {
    return make_error(ErrorCode::kIoError,
                      fmt::format("build claims: cannot create '{}': {}", impl->opt.dir, ec.message()));
  }
  // Prove that claims can be written here, the way every claim is written.
  Status st;
  const std::string probe = impl->write_aside(kMagic.data(), st);
  if (!st.ok()) return st;
  ::unlink(probe.c_str());
  {
    auto lock = FileLock::acquire(impl->lock_path, false);
    if (!lock.ok() && lock.status().code() != ErrorCode::kUnavailable) return lock.status();
  }

  std::unique_ptr<ClaimDir> dir(new ClaimDir(std::move(impl)));
  dir->clean_stale();
  Impl* m = dir->impl_.get();
  if (m->opt.renew_thread) {
    m->renewer = std::thread([m, d = dir.get()] {
      const auto period = std::max(std::chrono::milliseconds(10), m->opt.lease / 6);
      std::unique_lock lock(m->stop_mu);
      while (!m->stop_cv.wait_for(lock, period, [m] { return m->stopping; })) {
        lock.unlock();
        d->renew_due();
        lock.lock();
      }
    });
  }
  return dir;
}

const std::string& ClaimDir::dir() const { return impl_->opt.dir; }

Result<ClaimAnswer> ClaimDir::claim(const KernelKey& key) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (m.held.count(key)) return ClaimAnswer{ClaimState::kMine, {}, {}, false};
  }
  const std::string path = m.path_of(key);
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int64_t t = m.now();
    Record mine = m.fresh_record(t);
    // Read first: waiters ask again and again, and a read is cheaper than writing a claim that cannot win.
    std::optional<Record> cur = m.read(path);
    bool created = false;
    if (!cur) {
      KILN_ASSIGN_OR_RETURN(created, m.publish_new(path, mine));
      if (!created) cur = m.read(path);
    }
    bool took_over = false;
    if (!created) {
      if (!cur) continue;  // released between our link and our read: try again
      if (!m.stale(*cur, t)) {
        ClaimAnswer a;
        a.holder = cur->owner.describe();
        std::lock_guard lock(m.mu);
        switch (cur->state) {
          case State::kBuilding:
            a.state = ClaimState::kHeld;
            ++m.counters.held;
            break;
          case State::kBuilt:
            a.state = ClaimState::kBuilt;
            ++m.counters.held;
            break;
          case State::kFailed:
            a.state = ClaimState::kFailed;
            a.failure = make_error(static_cast<ErrorCode>(cur->code), cur->message, cur->detail);
            a.failure.with_context(fmt::format("recorded by the build claim of {} ({})", key.hex(), a.holder));
            ++m.counters.failures_read;
            break;
        }
        return a;
      }
      // Take the stale claim over: under the lock, and only if it is still the claim judged stale.
      auto dir_lock = m.lock_dir();
      if (!dir_lock) return ClaimAnswer{ClaimState::kHeld, "(the claims lock is busy)", {}, false};
      std::optional<Record> again = m.read(path);
      if (again && (again->nonce != cur->nonce || !m.stale(*again, m.now()))) continue;
      if (again && ::unlink(path.c_str()) != 0 && errno != ENOENT) return io_error("remove a stale claim", path);
      KILN_ASSIGN_OR_RETURN(created, m.publish_new(path, mine));
      if (!created) continue;  // someone claimed it in the meantime, without needing the lock
      took_over = true;
    }
    std::lock_guard lock(m.mu);
    m.held[key] = Impl::Held{mine.nonce, t};
    ++m.counters.claimed;
    if (took_over) ++m.counters.took_over;
    return ClaimAnswer{ClaimState::kMine, {}, {}, took_over};
  }
  // The claim kept changing under us: someone else is busy with it.
  return ClaimAnswer{ClaimState::kHeld, "(changing)", {}, false};
}

Status ClaimDir::release(const KernelKey& key, Outcome outcome, const Status& failure) {
  Impl& m = *impl_;
  Impl::Held h;
  {
    std::lock_guard lock(m.mu);
    auto it = m.held.find(key);
    if (it == m.held.end()) return Status();
    h = it->second;
    m.held.erase(it);
  }
  const std::string path = m.path_of(key);
  // Without the lock (busy for long) the release still happens: at worst it overwrites a claim taken over
  // after ours expired, which costs one duplicate compile, never a lost one.
  auto dir_lock = m.lock_dir();
  std::optional<Record> cur = m.read(path);
  if (!cur || cur->nonce != h.nonce) return Status();  // taken over after our lease ran out: not ours to touch
  if (outcome == Outcome::kAbandoned) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return io_error("remove", path);
    return Status();
  }
  Record r = *cur;
  const int64_t t = m.now();
  if (outcome == Outcome::kBuilt) {
    r.state = State::kBuilt;
    r.expires_ms = t + m.opt.built_grace.count();
  } else {
    r.state = State::kFailed;
    r.expires_ms = t + m.opt.failure_ttl.count();
    r.code = static_cast<int>(failure.code());
    r.message = failure.message();
    r.detail = failure.detail().substr(0, 64 * 1024);  // the head of a compile log is what says why
  }
  return m.replace(path, r);
}

size_t ClaimDir::renew_due() {
  Impl& m = *impl_;
  const int64_t t = m.now();
  const int64_t period = m.opt.lease.count() / 3;
  std::vector<std::pair<KernelKey, uint64_t>> due;
  {
    std::lock_guard lock(m.mu);
    for (const auto& [k, h] : m.held) {
      if (t - h.renewed_ms >= period) due.emplace_back(k, h.nonce);
    }
  }
  size_t renewed = 0;
  for (const auto& [key, nonce] : due) {
    const std::string path = m.path_of(key);
    auto dir_lock = m.lock_dir();
    if (!dir_lock) continue;  // next round
    std::optional<Record> cur = m.read(path);
    std::lock_guard lock(m.mu);
    auto it = m.held.find(key);
    if (it == m.held.end() || it->second.nonce != nonce) continue;  // released meanwhile
    if (!cur || cur->nonce != nonce) {
      // Lost (expired and taken over while this process was stopped): the compile goes on and its binary is
      // stored all the same; the claim is the other process's now.
      m.held.erase(it);
      continue;
    }
    Record r = *cur;
    r.expires_ms = t + m.opt.lease.count();
    if (m.replace(path, r).ok()) {
      it->second.renewed_ms = t;
      ++m.counters.renewed;
      ++renewed;
    }
  }
  return renewed;
}

size_t ClaimDir::clean_stale() {
  Impl& m = *impl_;
  size_t removed = 0;
  std::error_code ec;
  const auto wall_now = fs::file_time_type::clock::now();
  for (auto it = fs::directory_iterator(m.opt.dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (name.rfind(".tmp-", 0) == 0) {
      // A temporary claim lives for microseconds; one older than a lease was left by a crashed writer.
      std::error_code ec2;
      const auto mtime = fs::last_write_time(it->path(), ec2);
      if (!ec2 && wall_now - mtime > m.opt.lease && fs::remove(it->path(), ec2)) ++removed;
      continue;
    }
    if (!is_key_name(name)) continue;
    std::optional<Record> cur = m.read(path);
    if (!cur || !m.stale(*cur, m.now())) continue;
    auto dir_lock = m.lock_dir();
    if (!dir_lock) break;
    std::optional<Record> again = m.read(path);
    if (again && again->nonce == cur->nonce && m.stale(*again, m.now()) && ::unlink(path.c_str()) == 0) ++removed;
  }
  std::lock_guard lock(m.mu);
  m.counters.cleaned += removed;
  return removed;
}

std::vector<KernelKey> ClaimDir::held() const {
  std::lock_guard lock(impl_->mu);
  std::vector<KernelKey> out;
  for (const auto& [k, h] : impl_->held) out.push_back(k);
  return out;
}

ClaimCounters ClaimDir::counters() const {
  std::lock_guard lock(impl_->mu);
  return impl_->counters;
}

Result<bool> build_claims_from_env() {
  const char* v = std::getenv("KILN_BUILD_CLAIMS");
  if (v == nullptr || *v == '\0') return true;
  const std::string s = v;
  if (s == "on" || s == "1") return true;
  if (s == "off" || s == "0") return false;
  return make_error(ErrorCode::kInvalidArgument, fmt::format("KILN_BUILD_CLAIMS='{}': give on or off", s));
}

Result<ClaimOptions> claim_options_from_env(const std::string& cache_dir) {
  ClaimOptions o;
  o.dir = claims_dir(cache_dir);
  auto seconds = [](const char* name, std::chrono::milliseconds& out) -> Status {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return Status();
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s >= 0) || s > 86400) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}='{}': give seconds (0 to 86400)", name, v));
    }
    out = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    return Status();
  };
  KILN_RETURN_IF_ERROR(seconds("KILN_BUILD_CLAIM_LEASE", o.lease));
  KILN_RETURN_IF_ERROR(seconds("KILN_BUILD_CLAIM_SKEW", o.clock_skew));
  if (o.lease.count() <= 0) return make_error(ErrorCode::kInvalidArgument, "KILN_BUILD_CLAIM_LEASE must be positive");
  return o;
}

}  // namespace kiln::cache
