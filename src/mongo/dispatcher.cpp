#include "mongo/dispatcher.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/lane_hash.hpp"
#include "core/outbound_policy.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {
using nlohmann::json;
}

Dispatcher::Dispatcher(Config cfg, std::map<std::string, std::string> flags, Store& store, int signal_fd)
    : cfg_(std::move(cfg)),
      flags_(std::move(flags)),
      store_(store),
      signal_fd_(signal_fd),
      rng_(std::random_device{}()) {
  metrics_.commands = &store_.command_counts();
  metrics_.started_ms = wall_ms();
  sequencer_ = std::make_unique<Sequencer>(store_, cfg_.instance, cfg_.max_key_bytes);
}

Dispatcher::~Dispatcher() { store_.set_observer(nullptr); }

// Lease margin: a lane's results are completed only while its lease has at
// least this much left (clock skew between instances + the completing write).
static int64_t margin_ms(int64_t lease_ms) { return std::max<int64_t>(200, lease_ms / 5); }

bool Dispatcher::lane_valid(int lane, int64_t now) const {
  auto it = held_.find(lane);
  return it != held_.end() && now < it->second.until_ms - margin_ms(cfg_.lease_ms);
}

bool Dispatcher::ensure_engine() {
  if (engine_ && engine_allowlist_ == cfg_.http_allowlist) return true;
  core::HttpEngineOptions opts;
  std::string why;
  if (!core::parse_allowlist(cfg_.http_allowlist, &opts.allow, &why)) {
    log_error("http_allowlist is invalid; http callouts are off", {{"error", why}});
    return false;
  }
  if (engine_) {
    // A reloaded list applies at once, with requests in flight too: the
    // engine checks every connection and every request against it.
    engine_->set_allowlist(opts.allow);
    engine_allowlist_ = cfg_.http_allowlist;
    return true;
  }
  opts.max_total = cfg_.max_in_flight;
  engine_ = std::make_unique<core::HttpEngine>(opts);
  engine_allowlist_ = cfg_.http_allowlist;
  if (!engine_->ok()) {
    log_error("libcurl could not be initialized");
    engine_.reset();
    return false;
  }
  sink_ = std::make_unique<core::HttpSink>(*engine_);
  kafka_sink_ = std::make_unique<core::KafkaSink>();
  if (!kafka_sink_->ok()) {
    log_error("the kafka producers' wake-up pipe could not be made");
    kafka_sink_.reset();
    sink_.reset();
    engine_.reset();
    return false;
  }
  router_ = std::make_unique<core::RoutingSink>(*sink_, *kafka_sink_);
  core::PipelineOptions po;
  po.max_in_flight = cfg_.max_in_flight;
  pipeline_ = std::make_unique<core::DeliveryPipeline>(*router_, po, rng_());
  return true;
}

void Dispatcher::reload() {
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
  next_tick_ms_ = 0;                   // re-read handlers and lanes now
  if (engine_) (void)ensure_engine();  // a new http_allowlist applies to the next request
  log_info("configuration reloaded", {{"config_file", cfg_.config_file},
                                      {"lease_ms", cfg_.lease_ms},
                                      {"batch_size", cfg_.batch_size},
                                      {"http_allowlist", cfg_.http_allowlist}});
}

// ---------------------------------------------------------------- leases

void Dispatcher::lease_tick() {
  const int64_t now = wall_ms();
  next_tick_ms_ = now + tick_interval_ms();

  // The handler catalog (cheap: a handful of documents).
  std::vector<std::string> bad;
  auto docs = store_.load_handlers(&bad);
  for (const auto& b : bad)
    if (warned_.insert("handler " + b).second) log_warn("handler skipped", {{"error", b}});
  std::set<std::string> seen, seen_pull;
  for (auto& d : docs) {
    seen.insert(d.name);
    if (d.kind == core::HandlerKind::Pull) {  // served by the pull API, not sent
      seen_pull.insert(d.name);
      handlers_.erase(d.name);  // dropped as http and created again as pull
      pull_handlers_[d.name] = d;
      continue;
    }
    if (d.kind != core::HandlerKind::Http && d.kind != core::HandlerKind::Kafka) {
      if (warned_.insert("kind " + d.name).second)
        log_warn("handler kind not served by relaybus-mongo (http, pull and kafka)",
                 {{"handler", d.name}, {"kind", core::handler_kind_name(d.kind)}});
      continue;
    }
    auto [kit, fresh] = handler_keys_.try_emplace(d.name, static_cast<int>(handler_keys_.size()) + 1);
    HandlerState& hs = handlers_[d.name];
    hs.key = kit->second;
    hs.doc = std::move(d);
    (void)fresh;
    // Deliveries already claimed keep the handler as it was.
    auto pipe = std::make_shared<core::PipelineHandler>();
    pipe->key = hs.key;
    pipe->kind = hs.doc.kind;
    pipe->name = hs.doc.name;
    pipe->target = hs.doc.target;
    pipe->options = hs.doc.options;
    hs.pipe = std::move(pipe);
    // Before the fetch asks the pipeline for room: the sink's counts are by kind.
    if (router_) router_->set_kind(hs.key, hs.doc.kind);
  }
  for (auto it = handlers_.begin(); it != handlers_.end();)
    it = seen.count(it->first) ? std::next(it) : handlers_.erase(it);
  if (kafka_sink_) {  // producers of dropped handlers (or no longer kafka) close
    std::vector<int> kafka_keys;
    for (const auto& [name, h] : handlers_)
      if (h.doc.kind == core::HandlerKind::Kafka) kafka_keys.push_back(h.key);
    kafka_sink_->retain_handlers(kafka_keys);
  }
  for (auto it = pull_handlers_.begin(); it != pull_handlers_.end();)
    it = seen_pull.count(it->first) ? std::next(it) : pull_handlers_.erase(it);

  store_.heartbeat_load(cfg_.instance, now + cfg_.lease_ms, handler_load());
  const int live = std::max(1, store_.live_instances(now));
  const int share = (core::kLanes + live - 1) / live;

  std::map<int, LaneDoc> top;  // highest epoch per lane
  for (auto& l : store_.read_lanes()) {
    auto it = top.find(l.lane);
    if (it == top.end() || l.epoch > it->second.epoch) top[l.lane] = l;
  }
  settle_renewals();  // what the renewals during those reads found
  // Lanes someone else moved past our epoch are lost already.
  for (auto it = held_.begin(); it != held_.end();) {
    auto t = top.find(it->first);
    if (t != top.end() && t->second.epoch > it->second.epoch) {
      log_warn("lane lease lost", {{"lane", it->first},
                                   {"epoch", it->second.epoch},
                                   {"now_epoch", t->second.epoch},
                                   {"owner", t->second.owner}});
      metrics_.lanes_lost++;
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  // The sequencer role: one more lease in this tick's insert, outside the lane share.
  auto seq_top = top.find(kSequencerLane);
  if (seq_held_ && seq_top != top.end() && seq_top->second.epoch > seq_lease_.epoch) {
    log_warn("sequencer role lost",
             {{"epoch", seq_lease_.epoch}, {"now_epoch", seq_top->second.epoch}, {"owner", seq_top->second.owner}});
    seq_held_ = false;
    sequencer_->end();
  }
  // Above the fair share: drain the extra lanes (no new fetches), give them
  // back once nothing of theirs is in flight or awaiting completion.
  std::map<int, int> busy;  // lane -> queued, in flight or awaiting completion
  if (pipeline_) pipeline_->for_each_receipt([&](const core::Receipt& r) { busy[static_cast<int>(r.a)]++; });
  if (pull_) pull_->for_each_lane([&](int lane) { busy[lane]++; });  // a consumer still works on it
  int active = 0;
  for (const auto& [lane, h] : held_) active += h.draining ? 0 : 1;
  for (auto it = held_.rbegin(); it != held_.rend() && active > share; ++it)
    if (!it->second.draining) {
      it->second.draining = true;
      active--;
    }

  struct Op {
    int lane;
    enum { Renew, Release, Take } what;
  };
  std::vector<LaneDoc> inserts;
  std::vector<Op> ops;
  // Counted from now, after the reads above (a slow store makes them take
  // seconds): the insert is sent after this instant, so no other instance can
  // see the lease run out earlier than this instance does.
  const int64_t until = wall_ms() + cfg_.lease_ms;
  for (const auto& [lane, h] : held_) {
    bool release = stopping_ ? busy[lane] == 0 : (h.draining && busy[lane] == 0);
    inserts.push_back({lane, h.epoch + 1, release ? std::string() : cfg_.instance, release ? 0 : until});
    ops.push_back({lane, release ? Op::Release : Op::Renew});
  }
  if (!stopping_) {
    std::vector<int> free;
    for (int lane = 0; lane < core::kLanes; lane++) {
      if (held_.count(lane)) continue;
      auto t = top.find(lane);
      if (t == top.end() || t->second.owner.empty() || t->second.until_ms < now || t->second.owner == cfg_.instance)
        free.push_back(lane);
    }
    // Start at a random free lane so that instances starting together spread out.
    if (!free.empty()) std::rotate(free.begin(), free.begin() + rng_() % free.size(), free.end());
    for (int lane : free) {
      if (active >= share) break;
      auto t = top.find(lane);
      inserts.push_back({lane, t == top.end() ? 1 : t->second.epoch + 1, cfg_.instance, until});
      ops.push_back({lane, Op::Take});
      active++;
    }
  }
  if (seq_held_) {
    inserts.push_back(
        {kSequencerLane, seq_lease_.epoch + 1, stopping_ ? std::string() : cfg_.instance, stopping_ ? 0 : until});
    ops.push_back({kSequencerLane, stopping_ ? Op::Release : Op::Renew});
  } else if (!stopping_ && (seq_top == top.end() || seq_top->second.owner.empty() || seq_top->second.until_ms < now ||
                            seq_top->second.owner == cfg_.instance)) {
    inserts.push_back({kSequencerLane, seq_top == top.end() ? 1 : seq_top->second.epoch + 1, cfg_.instance, until});
    ops.push_back({kSequencerLane, Op::Take});
  }
  auto ok = store_.insert_lanes(inserts);
  renewed_at_ms_ = until - cfg_.lease_ms;
  std::vector<std::pair<int, int64_t>> old;
  std::vector<int> taken, released, lost;
  for (size_t i = 0; i < ops.size(); i++) {
    const int lane = ops[i].lane;
    const int64_t epoch = inserts[i].epoch;
    if (lane == kSequencerLane) {
      if (ops[i].what == Op::Take && ok[i]) {
        seq_lease_ = Held{epoch, until, false, epoch};
        seq_held_ = true;
        sequencer_->begin(epoch);
        next_sequence_ms_ = 0;
        log_info("sequencer role taken", {{"epoch", epoch}});
      } else if (ops[i].what == Op::Renew && ok[i]) {
        seq_lease_.epoch = epoch;
        seq_lease_.until_ms = until;
      } else if (ops[i].what != Op::Take) {
        if (!ok[i]) log_warn("sequencer role lost", {{"epoch", seq_lease_.epoch}});
        seq_held_ = false;
        sequencer_->end();
      }
      if (ok[i])
        for (int64_t e = std::max<int64_t>(1, epoch - 3); e < epoch; e++) old.emplace_back(lane, e);
      continue;
    }
    switch (ops[i].what) {
      case Op::Renew:
        if (ok[i]) {
          held_[lane].epoch = epoch;
          held_[lane].until_ms = until;
        } else {
          lost.push_back(lane);
          held_.erase(lane);
          metrics_.lanes_lost++;
        }
        break;
      case Op::Release:
        held_.erase(lane);
        if (ok[i]) {
          released.push_back(lane);
          metrics_.lanes_released++;
        }
        break;
      case Op::Take:
        if (ok[i]) {
          held_[lane] = Held{epoch, until, false, epoch};
          taken.push_back(lane);
          metrics_.lanes_taken++;
        }
        break;
    }
    if (ok[i])
      for (int64_t e = std::max<int64_t>(1, epoch - 3); e < epoch; e++) old.emplace_back(lane, e);
  }
  old.insert(old.end(), stale_lane_docs_.begin(), stale_lane_docs_.end());
  stale_lane_docs_.clear();
  store_.delete_lane_docs(old);
  metrics_.lanes_held = static_cast<int>(held_.size());
  metrics_.last_store_ok_ms = wall_ms();
  if (!taken.empty() || !released.empty() || !lost.empty())
    log_info("lanes", {{"taken", taken},
                       {"released", released},
                       {"lost", lost},
                       {"held", held_.size()},
                       {"instances", live},
                       {"share", share}});
  if (now >= next_backlog_ms_ && !stopping_) {  // after the leases: counting must not delay renewals
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
  // do not wait for it (renew_if_due).
  next_tick_ms_ = wall_ms() + tick_interval_ms();
}

void Dispatcher::renew_if_due() {
  settle_renewals();
  if ((!held_.empty() || seq_held_) && wall_ms() >= renewed_at_ms_ + tick_interval_ms()) renew_leases();
}

void Dispatcher::renew_leases() {
  if (held_.empty() && !seq_held_) return;
  const int64_t until = wall_ms() + cfg_.lease_ms;
  std::vector<LaneDoc> inserts;
  for (const auto& [lane, h] : held_) inserts.push_back({lane, h.epoch + 1, cfg_.instance, until});
  if (seq_held_) inserts.push_back({kSequencerLane, seq_lease_.epoch + 1, cfg_.instance, until});
  auto ok = store_.insert_lanes(inserts);
  renewed_at_ms_ = until - cfg_.lease_ms;
  std::vector<int> lost;
  for (size_t i = 0; i < inserts.size(); i++) {
    const int lane = inserts[i].lane;
    if (lane == kSequencerLane) {
      if (ok[i]) {
        seq_lease_.epoch = inserts[i].epoch;
        seq_lease_.until_ms = until;
      } else {
        lost.push_back(lane);
      }
    } else if (ok[i]) {
      held_[lane].epoch = inserts[i].epoch;
      held_[lane].until_ms = until;
    } else {
      lost.push_back(lane);
    }
  }
  // The epochs this skipped past are removed by the next lease_tick (it
  // deletes the three below each new epoch).
  metrics_.last_store_ok_ms = wall_ms();
  drop_lost(lost);
}

// Leases a renewal found taken (the sequencer role among them): given up.
void Dispatcher::drop_lost(const std::vector<int>& leases) {
  std::vector<int> lost;
  for (int lane : leases) {
    if (lane == kSequencerLane) {
      if (!seq_held_) continue;
      log_warn("sequencer role lost", {{"epoch", seq_lease_.epoch}});
      seq_held_ = false;
      sequencer_->end();
    } else if (held_.erase(lane) > 0) {
      lost.push_back(lane);
      metrics_.lanes_lost++;
    }
  }
  metrics_.lanes_held = static_cast<int>(held_.size());
  if (!lost.empty()) log_warn("lane lease lost", {{"lost", lost}, {"held", held_.size()}});
}

void Dispatcher::release_all() {
  stopping_ = true;
  if (held_.empty() && !seq_held_) return;
  try {
    lease_tick();  // with stopping_ set: every idle lane gets a release document
    store_.remove_instance(cfg_.instance);
  } catch (const StoreError& e) {
    log_warn("could not release lanes; they lapse after the lease", {{"error", e.what()}});
  }
}

// ---------------------------------------------------------------- fetching

void Dispatcher::fetch_all() {
  const int64_t now = wall_ms();
  next_fetch_ms_ = now + cfg_.poll_interval_ms;
  if (!ensure_engine()) return;
  bool any_lane = false;
  for (const auto& [lane, h] : held_)
    if (!h.draining && lane_valid(lane, now)) any_lane = true;
  if (!any_lane) return;
  claimer_.new_pass();
  for (auto& [name, h] : handlers_) {
    try {
      fetch_handler(h);
    } catch (const StoreError& e) {
      metrics_.store_errors++;
      log_warn("fetch failed", {{"handler", name}, {"error", e.what()}});
    }
  }
}

void Dispatcher::fetch_handler(HandlerState& h) {
  const int64_t now = wall_ms();
  const auto& o = h.doc.options;
  metrics_.breaker_open[h.doc.name] = pipeline_->breaker_open(h.key);
  // The pipeline's claim-ahead rule (the PostgreSQL dispatchers' too), a batch at most.
  const int cap = std::min(pipeline_->room(h.key, o.concurrency, now), cfg_.batch_size);
  if (cap <= 0) return;

  ClaimAsk ask;
  for (const auto& [lane, held] : held_)
    if (!held.draining && lane_valid(lane, now)) ask.lanes.push_back(lane);
  ask.window = claim_window_rows(cfg_);
  ask.limits.max = cap;
  ask.limits.per_key = 1;  // HTTP requests run concurrently: one per key in flight keeps the order
  ask.aging_ms = cfg_.priority_aging_ms;
  ask.now_ms = now;
  ask.handed_out = [this](int64_t id) { return pipeline_->holds(id); };
  LaneClaim got = claimer_.claim(h.doc.name, ask);
  if (got.deliveries.empty()) return;

  // The reads above may have outlasted a tick interval (a deep backlog on a
  // slow store: seconds). Renew before the plan's deliveries are queued:
  // with the lease's slack used up their receipts would not hold when the
  // pipeline sends them, and every one would go back unsent, pass after pass.
  renew_if_due();

  std::vector<core::ClaimedDelivery> claimed;
  claimed.reserve(got.deliveries.size());
  for (const Delivery& d : got.deliveries) {
    core::ClaimedDelivery c;
    c.message.id = d.id;
    c.message.event_id = d.event_id;
    c.message.topic = d.topic;
    c.message.has_key = d.has_key;
    c.message.key = d.key;
    c.message.seq = d.seq;
    c.message.attempt = d.attempt + 1;
    c.message.published_at_ms = d.published_ms;
    c.message.headers_json = d.headers_json;
    c.message.payload_json = d.payload_json;
    auto held = held_.find(d.lane);  // epoch 0 (no lane held) never holds
    c.receipt = core::Receipt{static_cast<uint64_t>(d.lane),
                              static_cast<uint64_t>(held != held_.end() ? held->second.since_epoch : 0)};
    c.published = d.published_ms;
    claimed.push_back(std::move(c));
  }
  // Held while the lane is: a queued delivery goes out only while its receipt
  // holds, and for a lease from now at most (not from the fetch's start: its
  // reads may have taken longer than that).
  pipeline_->enqueue(h.pipe, std::move(claimed), wall_ms() + cfg_.lease_ms);
  pipeline_->pump(*this, wall_ms());
  metrics_.in_flight = static_cast<int>(router_->in_flight());
  // More may be waiting: look again as soon as there is room.
  if (static_cast<int>(got.deliveries.size()) >= cap || got.may_have_more) next_fetch_ms_ = 0;
}

void Dispatcher::tick_if_due(int64_t& store_backoff_until) {
  const int64_t now = wall_ms();
  if (now < next_tick_ms_ || now < store_backoff_until) return;
  try {
    lease_tick();
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("lease renewal failed", {{"error", e.what()}});
    store_backoff_until = now + 1000;
    next_tick_ms_ = now + 1000;
  }
}

// ---------------------------------------------------------------- sequencing

void Dispatcher::sequence_some() {
  const int64_t now = wall_ms();
  next_sequence_ms_ = now + cfg_.poll_interval_ms;
  const int64_t since = seq_lease_.since_epoch;
  // Every write of the sequencer is fenced by its tenure: the same lease epoch,
  // with the lease margin still ahead.
  // Asked before every write: renewed first when due, as before any use of a
  // lease (a batch's commands on a slow store outlast the lease's slack).
  auto holds = [this, since] {
    renew_if_due();
    return seq_held_ && seq_lease_.since_epoch == since && wall_ms() < seq_lease_.until_ms - margin_ms(cfg_.lease_ms);
  };
  try {
    if (!holds()) return;
    const int n = sequencer_->step(cfg_.batch_size, now, holds);
    if (n > 0) {
      next_fetch_ms_ = 0;  // new deliveries
      metrics_.last_store_ok_ms = wall_ms();
    }
    if (n >= cfg_.batch_size) next_sequence_ms_ = 0;  // more may be waiting
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("sequencing failed; will retry", {{"error", e.what()}});
    next_sequence_ms_ = now + 500;
  }
}

// ---------------------------------------------------------------- completing

void Dispatcher::collect_results() {
  if (!pipeline_) return;
  pipeline_->collect(wall_ms());
  metrics_.in_flight = static_cast<int>(router_->in_flight());
}

bool Dispatcher::receipt_holds(const core::Receipt& r, int64_t now) const {
  const int lane = static_cast<int>(r.a);
  auto it = held_.find(lane);
  return it != held_.end() && static_cast<uint64_t>(it->second.since_epoch) == r.b && lane_valid(lane, now);
}

bool Dispatcher::still_held(const core::ClaimedDelivery& d, int64_t now) { return receipt_holds(d.receipt, now); }

void Dispatcher::release(const std::vector<core::ClaimedDelivery>& never_sent) {
  // Nothing to write: a delivery is leased with its lane, and read again
  // from the lane's window. Said when it is for a lapsed lease (a loop pass
  // longer than the lease's slack), which a healthy instance never sees.
  const int64_t now = wall_ms();
  size_t lapsed = 0;
  for (const auto& d : never_sent) lapsed += receipt_holds(d.receipt, now) ? 0 : 1;
  if (lapsed > 0)
    log_warn("deliveries given back unsent: their lane lease lapsed before they were sent",
             {{"deliveries", lapsed}, {"lease_ms", cfg_.lease_ms}});
}

void Dispatcher::complete(const std::vector<core::Completion>& batch) {
  // As before queuing: a pass of slow store calls since the last renewal
  // must not turn finished deliveries into dropped results (sent again).
  try {
    renew_if_due();
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    log_warn("lease renewal failed", {{"error", e.what()}});
  }
  const int64_t now = wall_ms();
  std::vector<int64_t> ok_ids;
  std::vector<Failure> failures;
  std::vector<const core::Completion*> ok_done;
  for (const core::Completion& c : batch) {
    if (!receipt_holds(c.receipt, now)) {
      // Fencing: the lease ran out or moved; whoever holds the lane now sends
      // this delivery again (a duplicate after a lease loss, never a loss).
      metrics_.handlers[c.handler].dropped++;
      log_warn("result dropped: lane lease not held", {{"id", c.id}, {"lane", c.receipt.a}});
      continue;
    }
    if (c.outcome == core::CompletionOutcome::Delivered) {
      ok_ids.push_back(c.id);
      ok_done.push_back(&c);
      continue;
    }
    const bool dead = c.outcome == core::CompletionOutcome::Dead;
    failures.push_back({c.id, c.error, c.status, dead, now + (dead ? 0 : c.retry_in_ms), c.handler});
  }
  store_.complete(ok_ids);
  store_.fail(failures, now);
  metrics_.last_store_ok_ms = wall_ms();
  for (const core::Completion* c : ok_done) {
    auto& m = metrics_.handlers[c->handler];
    m.delivered++;
    if (c->published > 0) metrics_.observe_latency(c->handler, (now - c->published) / 1000.0);
  }
  for (const auto& f : failures) {
    auto& m = metrics_.handlers[f.handler];
    (f.dead ? m.dead : m.retried)++;
    log(f.dead ? LogLevel::Warn : LogLevel::Info, f.dead ? "delivery dead-lettered" : "delivery will be retried",
        {{"id", f.id},
         {"handler", f.handler},
         {"error", f.error},
         {"status", f.status},
         {"retry_in_ms", f.dead ? 0 : f.not_before_ms - now}});
  }
}

void Dispatcher::flush() {
  if (!pipeline_ || pipeline_->waiting() == 0) return;
  try {
    pipeline_->flush(*this, wall_ms());
  } catch (const StoreError& e) {
    // The pipeline keeps the results and tries again after a pause; their
    // receipts drop them once the lanes are no longer held.
    metrics_.store_errors++;
    log_warn("completing a batch failed; will retry", {{"error", e.what()}, {"results", pipeline_->waiting()}});
    return;
  }
  // A completed key may have a successor ready now.
  next_fetch_ms_ = 0;
}

// ---------------------------------------------------------------- loop

void Dispatcher::begin(bool lanes) {
  // The metrics thread serves from this copy while the command runs.
  server_.publish(metrics_, 3 * cfg_.lease_ms);
  if (!window_) return;
  std::vector<CommandWindow::Lease> leases;
  for (const auto& [lane, h] : held_) leases.push_back({lane, h.epoch});
  if (seq_held_) leases.push_back({kSequencerLane, seq_lease_.epoch});
  const int64_t interval = tick_interval_ms();
  // A command that writes lane leases itself must not race a renewal of them.
  window_->open(engine_.get(), std::move(leases), cfg_.instance, renewed_at_ms_ + interval, interval, !lanes);
}

void Dispatcher::end() noexcept {
  if (!window_) return;
  window_->close();
  if (window_->renewed_any()) apply_renewals(window_->take_renewed());
}

// Inside a store method's bracket (end()): only values change here, no lane
// is dropped, so a caller iterating held_ around a store call is not upset.
void Dispatcher::apply_renewals(CommandWindow::Renewed r) noexcept {
  for (const auto& [lane, epoch] : r.epoch) {
    Held* h = nullptr;
    if (lane == kSequencerLane) {
      if (seq_held_) h = &seq_lease_;
    } else {
      auto it = held_.find(lane);
      if (it != held_.end()) h = &it->second;
    }
    if (h == nullptr || epoch <= h->epoch) continue;
    h->epoch = epoch;
    h->until_ms = r.until_ms;
  }
  for (const auto& [lane, epochs] : r.passed)
    for (int64_t e : epochs) stale_lane_docs_.emplace_back(lane, e);
  if (r.until_ms > 0) {
    renewed_at_ms_ = std::max(renewed_at_ms_, r.sent_ms);
    metrics_.last_store_ok_ms = wall_ms();
  }
  lost_in_window_.insert(lost_in_window_.end(), r.lost.begin(), r.lost.end());
  if (!r.error.empty()) window_error_ = r.error;
}

// Lanes a window's renewal found taken: dropped as renew_leases drops them.
void Dispatcher::settle_renewals() {
  if (!window_error_.empty()) {
    metrics_.store_errors++;
    log_warn("lease renewal during a store command failed", {{"error", window_error_}});
    window_error_.clear();
  }
  if (lost_in_window_.empty()) return;
  drop_lost(lost_in_window_);
  lost_in_window_.clear();
}

void Dispatcher::wait(int64_t max_ms) {
  std::vector<pollfd> fds;
  fds.push_back({signal_fd_, POLLIN, 0});
  const size_t engine_from = fds.size();
  if (engine_)
    for (const auto& w : engine_->sockets())
      fds.push_back({w.fd, static_cast<short>((w.read ? POLLIN : 0) | (w.write ? POLLOUT : 0)), 0});
  const size_t engine_to = fds.size();
  // The metrics thread serves from this copy while the next store command runs.
  server_.publish(metrics_, 3 * cfg_.lease_ms);
  // Pull API requests (they call the store): served here, between loop passes.
  fds.push_back({server_.api_fd(), POLLIN, 0});
  const size_t kafka_at = fds.size();  // the kafka producers' delivery reports
  fds.push_back({kafka_sink_ ? kafka_sink_->wait_fd() : -1, POLLIN, 0});
  int64_t t = max_ms;
  if (engine_) {
    int64_t et = engine_->timeout_ms();
    if (et >= 0) t = std::min(t, et);
  }
  t = std::max<int64_t>(0, t);
  int n = poll(fds.data(), fds.size(), static_cast<int>(t));
  if (n < 0 && errno != EINTR) log_warn("poll failed", {{"error", strerror(errno)}});
  {
    if (fds[0].revents & POLLIN) {
      char buf[64];
      ssize_t k = read(signal_fd_, buf, sizeof buf);
      for (ssize_t i = 0; i < k; i++) {
        if (buf[i] == 'T' && !stopping_) {
          stopping_ = true;
          stop_deadline_ms_ = monotonic_ms() + cfg_.drain_timeout_ms;
          log_info("stopping: draining in-flight deliveries", {{"in_flight", pipeline_ ? pipeline_->in_flight() : 0},
                                                               {"drain_timeout_ms", cfg_.drain_timeout_ms}});
        } else if (buf[i] == 'H') {
          reload();
        }
      }
    }
    if (engine_)
      for (size_t i = engine_from; i < engine_to; i++) {
        const pollfd& p = fds[i];
        if (p.revents == 0 || (p.revents & POLLNVAL)) continue;
        const bool failed = (p.revents & (POLLERR | POLLHUP)) != 0;
        engine_->on_socket(p.fd, failed || (p.revents & POLLIN), failed || (p.revents & POLLOUT));
      }
    if (fds[engine_to].revents & POLLIN) server_.serve_api();
    if (fds[kafka_at].revents & POLLIN) kafka_sink_->poll();  // reports become results: collect_results
  }
  if (kafka_sink_)
    for (const std::string& line : kafka_sink_->take_log()) log_warn(line);  // librdkafka's errors and warnings
  if (engine_ && (engine_->timeout_ms() == 0 || n == 0)) engine_->on_timeout();
}

int Dispatcher::run() {
  LogLevel l;
  if (parse_log_level(cfg_.log_level, &l)) set_log_level(l);
  if (!cfg_.metrics_listen.empty()) {
    std::string why;
    if (!server_.start(cfg_.metrics_listen, &why)) {
      log_error("cannot start the metrics endpoint", {{"error", why}});
      return 1;
    }
    server_.publish(metrics_, 3 * cfg_.lease_ms);  // /metrics from the first request on
  }
  log_info("relaybus-mongo dispatcher starting", {{"instance", cfg_.instance},
                                                  {"database", cfg_.database},
                                                  {"metrics", server_.bound()},
                                                  {"lease_ms", cfg_.lease_ms},
                                                  {"batch_size", cfg_.batch_size},
                                                  {"config_file", cfg_.config_file}});
  if (!ensure_engine()) return 1;
  try {  // the renewals' own connection
    window_ = std::make_unique<CommandWindow>(std::make_unique<Store>(cfg_.uri, cfg_.database), cfg_.lease_ms);
  } catch (const StoreError& e) {
    log_error("cannot create the lease renewals' client", {{"error", e.what()}});
    return 1;
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
  if (!wait_for_server()) {  // stopped before the server answered
    log_info("relaybus-mongo dispatcher stopped", {{"delivered", 0}, {"commands", store_.commands()}});
    return 0;
  }
  int64_t store_backoff_until = 0;
  for (;;) {
    settle_renewals();
    if (stopping_) {
      pipeline_->release_queued(*this);  // not sent: read again by the lanes' next holder
      collect_results();
      if (pipeline_->waiting() > 0) {
        try {
          flush();
        } catch (...) {
        }
      }
      if (pipeline_->in_flight() == 0 && pipeline_->waiting() == 0) break;
      if (monotonic_ms() > stop_deadline_ms_) {
        log_warn("drain timeout: abandoning in-flight requests (they are sent again later)",
                 {{"in_flight", pipeline_->in_flight()}});
        pipeline_->cancel_in_flight();
        break;
      }
      wait(50);
      continue;
    }
    tick_if_due(store_backoff_until);
    if (pull_->leased() > 0) {
      try {
        pull_->expire(wall_ms());  // pull leases that ran out: failed attempts
      } catch (const StoreError& e) {
        metrics_.store_errors++;
        log_warn("recording expired pull leases failed", {{"error", e.what()}});
      }
    }
    if (wall_ms() >= store_backoff_until) {
      try {
        renew_if_due();  // the tick's own reads (the backlog counts) may have used up the slack
      } catch (const StoreError& e) {
        metrics_.store_errors++;
        log_warn("lease renewal failed", {{"error", e.what()}});
        store_backoff_until = wall_ms() + 1000;
      }
    }
    pipeline_->pump(*this, wall_ms());  // queued deliveries go out as responses made room
    collect_results();
    if (pipeline_->completion_due(wall_ms())) flush();
    // Store calls block this loop (FerretDB: up to seconds each at a large
    // backlog): a renewal that fell due meanwhile goes first.
    if (wall_ms() >= next_fetch_ms_) {
      tick_if_due(store_backoff_until);
      fetch_all();
    }
    if (seq_held_ && wall_ms() >= next_sequence_ms_) {
      tick_if_due(store_backoff_until);
      sequence_some();
    }
    int64_t wait_ms = std::min(next_tick_ms_, next_fetch_ms_) - wall_ms();
    if (seq_held_) wait_ms = std::min(wait_ms, next_sequence_ms_ - wall_ms());
    // The pipeline's batching delay; an open breaker's probe.
    if (pipeline_->waiting() > 0) wait_ms = std::min<int64_t>(wait_ms, 2);
    const int64_t probe = pipeline_->next_probe_ms(wall_ms());
    if (probe >= 0) wait_ms = std::min<int64_t>(wait_ms, probe - wall_ms() + 1);
    wait(std::clamp<int64_t>(wait_ms, 0, 1000));
  }
  pull_.reset();  // its leases end with the process (a later ack gets 409): their lanes go back too
  release_all();
  store_.set_observer(nullptr);
  window_.reset();
  server_.stop();  // /metrics and /healthz until here; an API request still waiting gets 503
  log_info("relaybus-mongo dispatcher stopped", {{"delivered",
                                                  [&] {
                                                    uint64_t n = 0;
                                                    for (auto& [_, m] : metrics_.handlers) n += m.delivered;
                                                    return n;
                                                  }()},
                                                 {"commands", store_.commands()}});
  return 0;
}

// ---------------------------------------------------------------- pull handlers

const HandlerDoc* Dispatcher::pull_handler(const std::string& name) const {
  auto it = pull_handlers_.find(name);
  return it == pull_handlers_.end() ? nullptr : &it->second;
}

std::vector<std::pair<int, int64_t>> Dispatcher::claimable_lanes(int64_t now) const {
  std::vector<std::pair<int, int64_t>> out;
  if (stopping_) return out;
  for (const auto& [lane, h] : held_)
    if (!h.draining && lane_valid(lane, now)) out.emplace_back(lane, h.since_epoch);
  return out;
}

bool Dispatcher::lane_holds(int lane, int64_t since_epoch, int64_t now) const {
  return receipt_holds(core::Receipt{static_cast<uint64_t>(lane), static_cast<uint64_t>(since_epoch)}, now);
}

}  // namespace relaybus::mongo
