#include "mongo/dispatcher.hpp"

#include <algorithm>

#include "mongo/util.hpp"

namespace relaybus::mongo {

Dispatcher::Dispatcher(Config cfg, std::map<std::string, std::string> flags, Store& store, int signal_fd)
    : cfg_(std::move(cfg)),
      flags_(std::move(flags)),
      store_(store),
      waits_(signal_fd),
      rng_(std::random_device{}()),
      sequencer_(store_, cfg_.instance, cfg_.max_key_bytes),
      leases_(cfg_, store_, metrics_, sequencer_, rng_()) {
  metrics_.commands = &store_.command_counts();
  metrics_.started_ms = wall_ms();
  // A request queued while its lease held may leave a whole blocked loop
  // pass later (a slow store call), after the lease ran out and another
  // instance sent the key's later deliveries: it would arrive behind them.
  host_.set_send_check([this](int64_t id, const core::Receipt& r) {
    if (leases_.receipt_holds(r, wall_ms())) return true;
    log_warn("request not sent: lane lease lapsed before it went out", {{"id", id}, {"lane", r.a}});
    return false;
  });
}

Dispatcher::~Dispatcher() { store_.set_observer(nullptr); }

int Dispatcher::run() {
  if (!start()) return 1;
  if (!wait_for_server()) {  // stopped before the server answered
    log_info("relaybus-mongo dispatcher stopped", {{"delivered", 0}, {"commands", store_.commands()}});
    return 0;
  }
  for (;;) {
    interrupts();
    reload();
    leases_.settle_window();  // leases the last store command's renewals found taken
    if (loop_.stopping) {
      if (drain()) break;
      continue;
    }
    lanes();
    expire_pulls();
    renew();  // the tick's own reads (the backlog counts) may have used up the slack
    send();
    collect();
    settle();
    claim_and_stage();
    sequence();
    wait(next_wait_ms());
  }
  stop();
  return 0;
}

// ---------------------------------------------------------------- phases

void Dispatcher::interrupts() {
  if (!loop_.signals.stop) return;
  loop_.signals.stop = false;
  if (loop_.stopping) return;
  loop_.stopping = true;
  loop_.stop_deadline_ms = monotonic_ms() + cfg_.drain_timeout_ms;
  log_info("stopping: draining in-flight deliveries", {{"in_flight", host_.ready() ? host_.pipeline().in_flight() : 0},
                                                       {"drain_timeout_ms", cfg_.drain_timeout_ms}});
}

void Dispatcher::reload() {
  if (!loop_.signals.reload) return;
  loop_.signals.reload = false;
  Config c;
  std::string why;
  if (!load_config(flags_, &c, &why)) {
    log_error("reload failed; keeping the current settings", {{"error", why}});
    return;
  }
  // Settings that need a restart keep their values.
  c.uri = cfg_.uri;
  c.database = cfg_.database;
  c.instance = cfg_.instance;
  c.metrics_listen = cfg_.metrics_listen;
  c.max_in_flight = cfg_.max_in_flight;
  cfg_ = c;
  LogLevel l;
  if (parse_log_level(cfg_.log_level, &l)) set_log_level(l);
  loop_.next_tick_ms = 0;                             // re-read handlers and lanes now
  if (host_.ready()) (void)host_.ensure(cfg_, rng_);  // a new http_allowlist applies to the next request
  log_info("configuration reloaded", {{"config_file", cfg_.config_file},
                                      {"lease_ms", cfg_.lease_ms},
                                      {"batch_size", cfg_.batch_size},
                                      {"http_allowlist", cfg_.http_allowlist}});
}

bool Dispatcher::drain() {
  core::DeliveryPipeline& p = host_.pipeline();
  p.release_queued(*this);  // not sent: read again by the lanes' next holder
  collect();
  if (p.waiting() > 0) {
    try {
      flush();
    } catch (...) {
    }
  }
  if (p.in_flight() == 0 && p.waiting() == 0) return true;
  if (monotonic_ms() > loop_.stop_deadline_ms) {
    log_warn("drain timeout: abandoning in-flight requests (they are sent again later)",
             {{"in_flight", p.in_flight()}});
    p.cancel_in_flight();
    return true;
  }
  wait(50);
  return false;
}

void Dispatcher::lanes() { tick_if_due(); }

void Dispatcher::expire_pulls() {
  if (pull_->leased() == 0) return;
  try {
    pull_->expire(wall_ms());
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("recording expired pull leases failed", {{"error", e.what()}});
  }
}

void Dispatcher::renew() {
  if (!loop_.lease_backoff.ready(wall_ms())) return;
  try {
    leases_.renew_if_due();
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("lease renewal failed", {{"error", e.what()}});
    loop_.lease_backoff.failed(wall_ms(), core::StorePhase::Renewal);
  }
}

void Dispatcher::send() { host_.pipeline().pump(*this, wall_ms()); }

void Dispatcher::collect() {
  if (!host_.ready()) return;
  host_.pipeline().collect(wall_ms());
  metrics_.in_flight = static_cast<int>(host_.in_flight());
  if (core::SpanExporter* spans = host_.spans()) {
    spans->pump(wall_ms());
    const std::string failed = spans->take_error(wall_ms());
    if (!failed.empty())
      log_warn("span export failed; dropped spans are not sent again",
               {{"endpoint", cfg_.otlp_endpoint}, {"error", failed}, {"dropped", host_.spans_dropped()}});
  }
  metrics_.spans_exported = host_.spans_exported();
  metrics_.spans_dropped = host_.spans_dropped();
}

void Dispatcher::settle() {
  if (host_.pipeline().completion_due(wall_ms())) flush();
}

void Dispatcher::sequence() {
  // Store calls block this loop (FerretDB: up to seconds each at a large
  // backlog): a renewal that fell due meanwhile goes first.
  if (!leases_.sequencer_held() || wall_ms() < loop_.next_sequence_ms) return;
  tick_if_due();
  const int64_t now = wall_ms();
  loop_.next_sequence_ms = now + cfg_.poll_interval_ms;
  const int64_t since = leases_.sequencer_since();
  // Every write of the sequencer is fenced by its tenure: the same lease
  // epoch, with the lease margin still ahead. Asked before every write:
  // renewed first when due, as before any use of a lease (a batch's commands
  // on a slow store outlast the lease's slack).
  auto holds = [this, since] {
    leases_.renew_if_due();
    return leases_.sequencer_holds(since, wall_ms());
  };
  try {
    if (!holds()) return;
    const int n = sequencer_.step(cfg_.batch_size, now, holds);
    metrics_.trace_context_ignored = sequencer_.trace_context_ignored();
    if (n > 0) {
      loop_.next_fetch_ms = 0;  // new deliveries
      metrics_.last_store_ok_ms = wall_ms();
    }
    if (n >= cfg_.batch_size) loop_.next_sequence_ms = 0;  // more may be waiting
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("sequencing failed; will retry", {{"error", e.what()}});
    loop_.next_sequence_ms = now + core::on_store_error(core::StorePhase::Sequence).retry_in_ms;
  }
}

int64_t Dispatcher::next_wait_ms() {
  const int64_t now = wall_ms();
  int64_t ms = std::min(loop_.next_tick_ms, loop_.next_fetch_ms) - now;
  if (leases_.sequencer_held()) ms = std::min(ms, loop_.next_sequence_ms - now);
  core::DeliveryPipeline& p = host_.pipeline();
  // The pipeline's batching delay; an open breaker's probe.
  if (p.waiting() > 0) ms = std::min<int64_t>(ms, 2);
  const int64_t probe = p.next_probe_ms(now);
  if (probe >= 0) ms = std::min<int64_t>(ms, probe - now + 1);
  const int64_t spans = host_.spans() ? host_.spans()->wake_in_ms(now) : -1;
  if (spans >= 0) ms = std::min(ms, spans);
  const int64_t permit = p.next_permit_ms();  // a delivery held back by its handler's limits
  if (permit >= 0) ms = std::min<int64_t>(ms, permit - now);
  return std::clamp<int64_t>(ms, 0, 1000);
}

void Dispatcher::wait(int64_t max_ms) {
  // The metrics thread serves from this copy while the next store command runs.
  server_.publish(metrics_, 3 * cfg_.lease_ms);
  const Signals s = waits_.wait(max_ms, host_.engine(), server_, host_.kafka());
  loop_.signals.stop |= s.stop;
  loop_.signals.reload |= s.reload;
}

// ---------------------------------------------------------------- lanes

void Dispatcher::tick_if_due() {
  const int64_t now = wall_ms();
  if (now < loop_.next_tick_ms || !loop_.lease_backoff.ready(now)) return;
  try {
    lease_tick();
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("lease renewal failed", {{"error", e.what()}});
    loop_.lease_backoff.failed(now, core::StorePhase::Leases);
    loop_.next_tick_ms = loop_.lease_backoff.until_ms();
  }
}

void Dispatcher::lease_tick() {
  const int64_t now = wall_ms();
  loop_.next_tick_ms = now + leases_.interval_ms();
  std::vector<std::string> bad;
  auto docs = store_.load_handlers(&bad);  // cheap: a handful of documents
  catalog_.load(std::move(docs), bad);
  for (const auto& [name, h] : catalog_.sent()) host_.set_kind(h.key, h.doc.kind);
  host_.retain_kafka(catalog_.kafka_keys());
  store_.heartbeat_load(cfg_.instance, now + cfg_.lease_ms, handler_load());
  int rank = 0;
  const int live = std::max(1, store_.live_instances(now, cfg_.instance, &rank));
  host_.limiter().set_instances(live, rank);
  if (leases_.tick(
          now, live, [this] { return busy_lanes(); }, loop_.stopping))
    loop_.next_sequence_ms = 0;
  if (now >= loop_.next_backlog_ms && !loop_.stopping) {  // after the leases: counting must not delay renewals
    try {
      refresh_backlog(now);
    } catch (const StoreError& e) {
      metrics_.store_errors++;
      log_warn("counting the backlog failed", {{"error", e.what()}});
    }
  }
  // The next tick a tick interval after this one ends, not after it started:
  // a tick whose reads took longer than the interval (a slow store) would
  // otherwise be due again at once and leave no time to deliver. Renewals
  // do not wait for it (LaneLeases::renew_if_due).
  loop_.next_tick_ms = wall_ms() + leases_.interval_ms();
}

std::map<int, int> Dispatcher::busy_lanes() {
  std::map<int, int> busy;
  if (host_.ready()) host_.pipeline().for_each_receipt([&](const core::Receipt& r) { busy[static_cast<int>(r.a)]++; });
  if (pull_) pull_->for_each_lane([&](int lane) { busy[lane]++; });  // a consumer still works on it
  return busy;
}

void Dispatcher::release_all() {
  loop_.stopping = true;
  if (!leases_.any()) return;
  try {
    lease_tick();  // stopping: every idle lease gets a release document
    store_.remove_instance(cfg_.instance);
  } catch (const StoreError& e) {
    log_warn("could not release lanes; they lapse after the lease", {{"error", e.what()}});
  }
}

// ---------------------------------------------------------------- start and stop

bool Dispatcher::start() {
  LogLevel l;
  if (parse_log_level(cfg_.log_level, &l)) set_log_level(l);
  if (!cfg_.metrics_listen.empty()) {
    std::string why;
    if (!server_.start(cfg_.metrics_listen, &why)) {
      log_error("cannot start the metrics endpoint", {{"error", why}});
      return false;
    }
    server_.publish(metrics_, 3 * cfg_.lease_ms);  // /metrics from the first request on
  }
  log_info("relaybus-mongo dispatcher starting", {{"instance", cfg_.instance},
                                                  {"database", cfg_.database},
                                                  {"metrics", server_.bound()},
                                                  {"lease_ms", cfg_.lease_ms},
                                                  {"batch_size", cfg_.batch_size},
                                                  {"config_file", cfg_.config_file}});
  if (!host_.ensure(cfg_, rng_)) return false;
  try {  // the renewals' own connection
    window_ = std::make_unique<CommandWindow>(std::make_unique<Store>(cfg_.uri, cfg_.database), cfg_.lease_ms);
  } catch (const StoreError& e) {
    log_error("cannot create the lease renewals' client", {{"error", e.what()}});
    return false;
  }
  store_.set_observer(this);
  const PullHost& host = *this;
  pull_ = std::make_unique<PullApi>(store_, metrics_, host, rng_());
  server_.set_api(
      [this](const std::string& method, const std::string& path, const std::string& auth, const std::string& body) {
        ApiResponse r =
            pull_->handle(method, path, auth, body, cfg_.api_token, claim_window_rows(cfg_), cfg_.priority_aging_ms);
        return std::make_pair(r.status, r.body);
      });
  return true;
}

void Dispatcher::stop() {
  pull_.reset();  // its leases end with the process (a later ack gets 409): their lanes go back too
  release_all();
  store_.set_observer(nullptr);
  window_.reset();
  server_.stop();  // /metrics and /healthz until here; an API request still waiting gets 503
  uint64_t delivered = 0;
  for (auto& [_, m] : metrics_.handlers) delivered += m.delivered;
  log_info("relaybus-mongo dispatcher stopped", {{"delivered", delivered}, {"commands", store_.commands()}});
}

// ---------------------------------------------------------------- the store's commands

void Dispatcher::begin(bool lanes) {
  // The metrics thread serves from this copy while the command runs.
  server_.publish(metrics_, 3 * cfg_.lease_ms);
  if (!window_) return;
  const int64_t interval = leases_.interval_ms();
  // A command that writes lane leases itself must not race a renewal of them.
  window_->open(host_.engine(), leases_.window_leases(), cfg_.instance, leases_.window_due_ms(), interval, !lanes);
}

void Dispatcher::end() noexcept {
  if (!window_) return;
  window_->close();
  if (window_->renewed_any()) leases_.apply_window(window_->take_renewed());
}

// ---------------------------------------------------------------- the pull API's view

const HandlerDoc* Dispatcher::pull_handler(const std::string& name) const { return catalog_.pull_handler(name); }

std::vector<std::pair<int, int64_t>> Dispatcher::claimable_lanes(int64_t now) const {
  if (loop_.stopping) return {};
  return leases_.claimable(now);
}

bool Dispatcher::lane_holds(int lane, int64_t since_epoch, int64_t now) const {
  return leases_.receipt_holds(core::Receipt{static_cast<uint64_t>(lane), static_cast<uint64_t>(since_epoch)}, now);
}

}  // namespace relaybus::mongo
