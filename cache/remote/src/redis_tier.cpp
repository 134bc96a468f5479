// RedisTier: read-through lookups and the write-behind queue. Every call goes through the circuit breaker
// and the connection's timeouts, so a slow or dead Redis costs a serving process at most a few bounded
// misses before kiln runs local-only for the cool-down.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "kiln/cache/problem_key.h"
#include "tier_impl.h"

namespace kiln::cache {
namespace {

constexpr size_t kBatchEntries = 64;
constexpr size_t kBatchBytes = 16u << 20;

std::string key_prefix() { return fmt::format("kiln:f{}:", value_format_version()); }

size_t entry_bytes(const Binary& b) { return b.cubin.size() + b.ptx.size() + b.log.size() + b.name.size() + 256; }

}  // namespace

void log_reachable_again(std::string_view where) {
  spdlog::info("kiln remote cache: {} answers again; using it", where);
}

std::string problem_arch(std::string_view problem) {
  auto k = ProblemKey::parse(problem);
  if (!k.ok() || k->device.cc_major <= 0) return "any";
  return fmt::format("sm_{}{}", k->device.cc_major, k->device.cc_minor);
}

std::string remote_binary_key(const KernelKey& key, std::string_view arch) {
  return fmt::format("{}bin:{}:{}", key_prefix(), arch.empty() ? "any" : arch, key.hex());
}
std::string remote_decision_key(std::string_view problem) {
  return fmt::format("{}dec:{}:{}", key_prefix(), problem_arch(problem), problem);
}
std::string remote_timings_key(std::string_view problem) {
  return fmt::format("{}tim:{}:{}", key_prefix(), problem_arch(problem), problem);
}

RedisTier::Impl::Impl(RemoteOptions o)
    : opt(std::move(o)), breaker(opt.breaker_failures, opt.breaker_cooldown, opt.clock) {}

void RedisTier::Impl::note_error(const Status& s) {
  std::lock_guard lock(err_mu);
  last_error = s.to_string();
}

void RedisTier::Impl::note_unreachable(const Status& s) {
  note_error(s);
  switch (breaker.failure()) {
    case CircuitBreaker::Opened::kFirst:
      spdlog::warn("kiln remote cache: {}; kiln works from its local cache only for the next {} ms, then tries "
                   "the remote again",
                   s.message(), opt.breaker_cooldown.count());
      break;
    case CircuitBreaker::Opened::kAgain:
    case CircuitBreaker::Opened::kNo: break;
  }
}

void RedisTier::Impl::count_refusal(Refusal why, std::string_view slot, const Status& s) {
  ++(why == Refusal::kUnsigned ? n.refused_unsigned : why == Refusal::kBadSignature ? n.refused_signature
                                                                                    : n.refused_malformed);
  note_error(make_error(s.code(), fmt::format("refused the value of {}: {}", slot, s.message())));
  // A refusal may be an attack: always said, but at most 20 lines per process.
  static std::atomic<int> logged{0};
  if (logged.fetch_add(1) < 20) {
    spdlog::warn("kiln remote cache: refused the value of {} from {} ({}): {}", slot.substr(0, 160), where,
                 refusal_name(why), s.message());
  }
}

Result<std::unique_ptr<RedisConnection>> RedisTier::Impl::connect_now() const {
  return RedisConnection::connect(url, opt.connect_timeout, opt.read_timeout);
}

// ---- RemoteOptions

Result<std::optional<RemoteOptions>> RemoteOptions::from_env(std::string url) {
  if (url.empty()) {
    const char* env = std::getenv("KILN_REMOTE_CACHE");
    if (env == nullptr || *env == '\0') return std::optional<RemoteOptions>();
    url = env;
  }
  RemoteOptions o;
  o.url = std::move(url);
  if (const char* k = std::getenv("KILN_CACHE_KEY_FILE"); k && *k) o.key_file = k;
  if (const char* a = std::getenv("KILN_REMOTE_ALLOW_UNSIGNED"); a && *a) {
    std::string_view v = a;
    if (v != "0" && v != "1") {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("KILN_REMOTE_ALLOW_UNSIGNED is '{}'; use 1 or 0", v));
    }
    o.allow_unsigned_binaries = v == "1";
  }
  for (auto [name, field] : {std::pair{"KILN_REMOTE_CONNECT_TIMEOUT_MS", &o.connect_timeout},
                             std::pair{"KILN_REMOTE_READ_TIMEOUT_MS", &o.read_timeout}}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    long ms = std::strtol(v, &end, 10);
    if (*end != '\0' || ms < 1 || ms > 600000) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{} is '{}'; give milliseconds, 1 to 600000", name, v));
    }
    *field = std::chrono::milliseconds(ms);
  }
  return std::optional<RemoteOptions>(std::move(o));
}

// ---- RedisTier

Result<std::shared_ptr<RedisTier>> RedisTier::open(RemoteOptions options) {
  KILN_ASSIGN_OR_RETURN(RemoteUrl url, RemoteUrl::parse(options.url));
  if (options.connect_timeout.count() <= 0 || options.read_timeout.count() <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "remote cache timeouts must be positive");
  }
  if (options.queue_entries == 0) return make_error(ErrorCode::kInvalidArgument, "remote cache queue_entries must be at least 1");
  std::optional<SigningKey> key = options.key;
  if (!key && !options.key_file.empty()) {
    KILN_ASSIGN_OR_RETURN(SigningKey k, SigningKey::load(options.key_file).with_context("reading the fleet key"));
    key = std::move(k);
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->url = std::move(url);
  impl->where = impl->url.display();
  impl->key = std::move(key);
  impl->policy = SealPolicy{impl->key ? &*impl->key : nullptr, impl->opt.allow_unsigned_binaries};
  Impl* raw = impl.get();
  if (raw->opt.write_behind) raw->writer = std::jthread([raw] { raw->write_loop(); });
  return std::shared_ptr<RedisTier>(new RedisTier(std::move(impl)));
}

RedisTier::RedisTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RedisTier::~RedisTier() {
  Impl& m = *impl_;
  if (m.writer.joinable()) {
    (void)drain(m.opt.drain_timeout);
    {
      std::lock_guard lock(m.q_mu);
      m.n.write_errors += m.queue.size();  // not published before the process ends: said in the counters
      m.queue.clear();
      m.queue_bytes = 0;
      m.stopping = true;
    }
    m.q_cv.notify_all();
    m.writer.join();
  }
  // This process's counters join the fleet's (best effort: never waits past the timeouts).
  RemoteCounters c = counters();
  std::vector<std::pair<const char*, uint64_t>> fields = {
      {"hits", c.hits},         {"misses", c.misses},           {"refused", c.refused},
      {"errors", c.errors},     {"skipped", c.skipped},         {"published", c.published},
      {"queue_drops", c.queue_drops}, {"write_errors", c.write_errors}, {"withheld", c.withheld},
      {"breaker_opened", c.breaker_opened}};
  std::vector<std::vector<std::string>> cmds;
  for (auto [name, v] : fields) {
    if (v != 0) cmds.push_back({"HINCRBY", key_prefix() + "stats", name, std::to_string(v)});
  }
  if (cmds.empty()) return;
  std::lock_guard lock(m.read_mu);
  (void)m.attempt<std::vector<Reply>>(m.read_conn, [&](RedisConnection& conn) { return conn.pipeline(cmds); }, nullptr, nullptr);
}

std::string RedisTier::describe() const { return impl_->where; }
bool RedisTier::signing() const { return impl_->key.has_value(); }

RemoteCounters RedisTier::counters() const {
  const Impl& m = *impl_;
  RemoteCounters c;
  c.hits = m.n.hits;
  c.misses = m.n.misses;
  c.refused_unsigned = m.n.refused_unsigned;
  c.refused_signature = m.n.refused_signature;
  c.refused_malformed = m.n.refused_malformed;
  c.refused = c.refused_unsigned + c.refused_signature + c.refused_malformed;
  c.errors = m.n.errors;
  c.skipped = m.n.skipped;
  c.queued = m.n.queued;
  c.published = m.n.published;
  c.queue_drops = m.n.queue_drops;
  c.write_errors = m.n.write_errors;
  c.withheld = m.n.withheld;
  c.breaker_opened = m.breaker.times_opened();
  c.breaker = std::string(CircuitBreaker::name(m.breaker.state()));
  std::lock_guard lock(m.err_mu);
  c.last_error = m.last_error;
  return c;
}

Status RedisTier::ping() {
  Impl& m = *impl_;
  KILN_ASSIGN_OR_RETURN(auto conn, m.connect_now());
  KILN_ASSIGN_OR_RETURN(Reply r, conn->command({"PING"}));
  if (r.type == Reply::kError) return make_error(ErrorCode::kUnavailable, fmt::format("{}: PING: {}", m.where, r.str));
  if (m.breaker.success()) log_reachable_again(m.where);
  return Status();
}

// ---- read-through

std::optional<Binary> RedisTier::fetch_binary(const KernelKey& key, std::string_view arch) {
  Impl& m = *impl_;
  if (!m.may_send_binaries()) return std::nullopt;  // would be refused: not worth a round trip
  const std::string slot = remote_binary_key(key, arch);
  std::optional<Reply> r;
  {
    std::lock_guard lock(m.read_mu);
    r = m.attempt<Reply>(m.read_conn, [&](RedisConnection& c) { return c.command({"GET", slot}); }, &m.n.skipped, &m.n.errors);
  }
  if (!r) return std::nullopt;
  if (r->type != Reply::kString) {
    ++(r->type == Reply::kError ? m.n.errors : m.n.misses);
    return std::nullopt;
  }
  Refusal why;
  auto b = unseal_binary(slot, r->str, key, m.policy, &why);
  if (!b.ok()) {
    m.count_refusal(why, slot, b.status());
    return std::nullopt;
  }
  if (!arch.empty() && b->arch != arch) {
    m.count_refusal(Refusal::kMalformed, slot, make_error(ErrorCode::kCorrupt, fmt::format("built for {}", b->arch)));
    return std::nullopt;
  }
  ++m.n.hits;
  return std::move(b).value();
}

std::optional<Decision> RedisTier::fetch_decision(std::string_view problem) {
  Impl& m = *impl_;
  const std::string slot = remote_decision_key(problem);
  std::optional<Reply> r;
  {
    std::lock_guard lock(m.read_mu);
    r = m.attempt<Reply>(m.read_conn, [&](RedisConnection& c) { return c.command({"GET", slot}); }, &m.n.skipped, &m.n.errors);
  }
  if (!r || r->type != Reply::kString) {
    if (r) ++(r->type == Reply::kError ? m.n.errors : m.n.misses);
    return std::nullopt;
  }
  Refusal why;
  auto d = unseal_decision(slot, r->str, problem, m.policy, &why);
  if (!d.ok()) {
    m.count_refusal(why, slot, d.status());
    return std::nullopt;
  }
  ++m.n.hits;
  return std::move(d).value();
}

std::vector<TimingRecord> RedisTier::fetch_timings(std::string_view problem) {
  Impl& m = *impl_;
  const std::string slot = remote_timings_key(problem);
  std::optional<Reply> r;
  {
    std::lock_guard lock(m.read_mu);
    r = m.attempt<Reply>(m.read_conn, [&](RedisConnection& c) { return c.command({"HGETALL", slot}); }, &m.n.skipped, &m.n.errors);
  }
  std::vector<TimingRecord> out;
  if (!r || r->type != Reply::kArray) {
    if (r && r->type == Reply::kError) ++m.n.errors;
    return out;
  }
  if (r->elements.empty()) {
    ++m.n.misses;
    return out;
  }
  for (size_t i = 0; i + 1 < r->elements.size(); i += 2) {
    const std::string& choice = r->elements[i].str;
    const std::string field_slot = slot + "\n" + choice;
    Refusal why;
    auto t = unseal_timing(field_slot, r->elements[i + 1].str, problem, choice, m.policy, &why);
    if (!t.ok()) {
      m.count_refusal(why, field_slot, t.status());
      continue;
    }
    out.push_back(std::move(t).value());
  }
  if (!out.empty()) ++m.n.hits;
  return out;
}

// ---- write-behind

void RedisTier::Impl::enqueue(Entry e, size_t bytes) {
  {
    std::lock_guard lock(q_mu);
    if (stopping || queue.size() >= opt.queue_entries || queue_bytes + bytes > opt.queue_bytes) {
      ++n.queue_drops;
      return;
    }
    queue.push_back({std::move(e), bytes});
    queue_bytes += bytes;
    ++n.queued;
  }
  q_cv.notify_one();
}

void RedisTier::publish_binary(const Binary& binary) {
  Impl& m = *impl_;
  if (!m.opt.write_behind) return;
  if (!m.may_send_binaries()) {
    ++m.n.withheld;
    return;
  }
  m.enqueue(binary, entry_bytes(binary));
}

void RedisTier::publish_timing(const TimingRecord& timing) {
  if (!impl_->opt.write_behind) return;
  impl_->enqueue(timing, timing.problem.size() + timing.reason.size() + 256);
}

void RedisTier::publish_decision(const Decision& decision) {
  if (!impl_->opt.write_behind) return;
  impl_->enqueue(decision, decision.problem.size() + 512);
}

std::vector<std::string> RedisTier::Impl::store_command(const Entry& e) const {
  const SigningKey* k = key ? &*key : nullptr;
  if (auto* b = std::get_if<Binary>(&e)) {
    std::string slot = remote_binary_key(b->key, b->arch);
    std::string value = seal_binary(slot, *b, k);
    return {"SET", std::move(slot), std::move(value)};
  }
  if (auto* t = std::get_if<TimingRecord>(&e)) {
    std::string slot = remote_timings_key(t->problem);
    std::string value = seal_timing(slot + "\n" + t->choice, *t, k);
    return {"HSET", std::move(slot), t->choice, std::move(value)};
  }
  const auto& d = std::get<Decision>(e);
  std::string slot = remote_decision_key(d.problem);
  std::string value = seal_decision(slot, d, k);
  return {"SET", std::move(slot), std::move(value)};
}

void RedisTier::Impl::write_loop() {
  for (;;) {
    std::vector<Queued> batch;
    {
      std::unique_lock lock(q_mu);
      q_cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping
      size_t bytes = 0;
      while (!queue.empty() && batch.size() < kBatchEntries && (batch.empty() || bytes + queue.front().bytes <= kBatchBytes)) {
        bytes += queue.front().bytes;
        queue_bytes -= queue.front().bytes;
        batch.push_back(std::move(queue.front()));
        queue.pop_front();
      }
      in_flight = batch.size();
    }
    std::vector<std::vector<std::string>> cmds;
    cmds.reserve(batch.size());
    for (const auto& q : batch) cmds.push_back(store_command(q.entry));
    auto replies = attempt<std::vector<Reply>>(write_conn, [&](RedisConnection& c) { return c.pipeline(cmds); }, nullptr, nullptr);
    if (!replies) {
      n.write_errors += batch.size();
    } else {
      for (const Reply& r : *replies) {
        if (r.type != Reply::kError) {
          ++n.published;
          continue;
        }
        ++n.write_errors;
        note_error(make_error(ErrorCode::kUnavailable, fmt::format("{} refused a write: {}", where, r.str)));
        std::lock_guard lock(err_mu);
        if (!reported_write_refusal) {
          reported_write_refusal = true;
          spdlog::warn("kiln remote cache: {} refuses writes ({}); entries stay in the local cache only", where, r.str);
        }
      }
    }
    {
      std::lock_guard lock(q_mu);
      in_flight = 0;
    }
    idle_cv.notify_all();
  }
}

Status RedisTier::drain(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  std::unique_lock lock(m.q_mu);
  if (!m.idle_cv.wait_for(lock, timeout, [&] { return m.queue.empty() && m.in_flight == 0; })) {
    return make_error(ErrorCode::kTimeout, fmt::format("{} entries still queued for {} after {} ms",
                                                       m.queue.size() + m.in_flight, m.where, timeout.count()));
  }
  return Status();
}

}  // namespace kiln::cache
