#include "agent/agent.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "core/json_log.hpp"
#include "core/backoff.hpp"
#include "core/clock.hpp"
#include "core/cloudevents.hpp"
#include "core/error_class.hpp"
#include "core/handler_config.hpp"
#include "core/lease_token.hpp"
#include "core/outbound_policy.hpp"
#include "core/version.hpp"

namespace relaybus::agent {

using core::log_debug;
using core::log_error;
using core::log_info;
using core::log_warn;
using core::monotonic_ms;
using core::wall_ms;

namespace {
// A handler whose statement failed (not a lost connection) waits this long.
constexpr int64_t kHandlerErrorBackoffMs = 1000;
// Notify iterations of one handler in a row before the others get a turn.
constexpr int kNotifyRounds = 10;
}  // namespace

Agent::Agent(AgentConfig config) : cfg_(std::move(config)) {
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  report_name_ = std::string(*host != '\0' ? host : "agent") + ":" + std::to_string(getpid());
  started_ms_ = wall_ms();
}

Agent::Connect Agent::connect_and_check() {
  std::string why;
  if (!conn_.connect(cfg_.database, &why)) {
    log_error("cannot connect to the database", {{"error", why}});
    std::lock_guard<std::mutex> lock(metrics_.mu);
    metrics_.connect_failures++;
    return Connect::Retry;
  }
  try {
    // By name in pg_proc: resolving relay._agent_claim(...) would fail for a
    // role without USAGE on schema relay instead of answering.
    PgResult r = conn_.exec(
        "SELECT current_user, current_database(), pg_is_in_recovery(),"
        " EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'relaybus'),"
        " c.n = 5, c.n = 5 AND c.may, current_setting('server_version'), pg_backend_pid()"
        " FROM (SELECT count(*) AS n, coalesce(bool_and(has_schema_privilege(n.oid, 'USAGE')"
        "                                  AND has_function_privilege(p.oid, 'EXECUTE')), false) AS may"
        "         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
        "        WHERE n.nspname = 'relay' AND p.proname IN ('_agent_handlers', '_agent_claim', '_agent_notify',"
        "                                                    '_agent_settle', '_agent_release')) c");
    nlohmann::json where = {{"user", r.text(0, 0)}, {"database", r.text(0, 1)}};
    if (r.text(0, 3) == "t") {
      where["hint"] =
          "the in-server workers deliver a database with the extension; run the agent only against the managed SQL edition (docs/managed.md)";
      log_error("refusing a database where the relaybus extension is installed", where);
      conn_.close();
      return Connect::Fatal;
    }
    if (r.text(0, 4) != "t") {
      where["hint"] = "install build/relaybus-managed--VERSION.sql as the database owner (docs/managed.md)";
      log_error("the managed SQL edition with relaybus-agent's functions is not installed in this database", where);
      conn_.close();
      return Connect::Fatal;
    }
    if (r.text(0, 5) != "t") {
      where["hint"] = "GRANT relay_agent TO " + r.text(0, 0);
      log_error("the agent's role may not execute relaybus-agent's functions (it is not a member of relay_agent)",
                where);
      conn_.close();
      return Connect::Fatal;
    }
    if (r.text(0, 2) == "t") {
      where["hint"] = "connect to the primary: list every host and add target_session_attrs=read-write";
      log_warn("the server is in recovery (a standby): trying again", where);
      conn_.close();
      return Connect::Retry;
    }
    // Settings the statements depend on, whatever the role or database set.
    conn_.exec(
        "SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false),"
        " set_config('idle_in_transaction_session_timeout', '0', false),"
        " set_config('default_transaction_isolation', 'read committed', false),"
        " set_config('default_transaction_read_only', 'off', false),"
        " set_config('search_path', 'pg_catalog, pg_temp', false),"
        " set_config('relaybus.claim_scan_limit', $1, false)",
        {std::to_string(cfg_.claim_scan_limit)});
    conn_.exec("LISTEN relaybus");
    where["server_version"] = r.text(0, 6);
    where["pid"] = r.integer(0, 7);
    const char* host = PQhost(conn_.raw());
    where["host"] = host == nullptr ? "" : host;
    log_info("connected", where);
    return Connect::Ok;
  } catch (const PgError& e) {
    log_error("checking the database failed", {{"sqlstate", e.sqlstate}, {"error", e.what()}});
    conn_.close();
    return Connect::Retry;
  }
}

void Agent::load_handlers() {
  PgResult r = conn_.exec(
      "SELECT id, name, kind, coalesce(target, ''),"
      " (CASE WHEN cardinality(secrets) > 0 THEN options || jsonb_build_object('secret', to_jsonb(secrets))"
      "       ELSE options END)::text,"
      " paused, message_id_prefix, current_database() FROM relay._agent_handlers()");
  std::map<int, Handler> next;
  int notify = 0, http = 0;
  std::vector<int> kafka;
  for (int i = 0; i < r.rows(); i++) {
    auto p = std::make_shared<core::PipelineHandler>();
    p->key = static_cast<int>(r.integer(i, 0));
    p->name = r.text(i, 1);
    std::string why;
    if (!core::parse_handler_kind(r.text(i, 2), &p->kind, &why)) continue;
    p->target = r.text(i, 3);
    // Stored options were validated on the way in; defaults are the safe
    // reading of a row written by hand.
    if (!core::parse_handler_options(p->kind, r.text(i, 4), &p->options, &why)) {
      log_warn("handler options unreadable, using the defaults", {{"handler", p->name}, {"error", why}});
      p->options = core::HandlerOptions{};
    }
    p->options.message_id_prefix = r.text(i, 6);
    // The extension's default, so an event keeps its source across editions.
    p->options.default_cloudevents_source = core::default_cloudevents_source("/relaybus/", r.text(i, 7));
    Handler h;
    auto old = handlers_.find(p->key);
    if (old != handlers_.end()) {
      h.due = old->second.due;
      h.notify_policy = old->second.notify_policy;
    }
    h.paused = r.text(i, 5) == "t";
    if (p->kind == core::HandlerKind::Http || p->kind == core::HandlerKind::Kafka) {
      // A kafka send, like a request, ends by its timeout: the lease covers it.
      h.lease_ms = core::http_lease_ms(p->options.lease_ms, p->options.timeout_ms, cfg_.http_lease_margin_ms);
      // The pipeline's bound on the handler: a kafka handler's concurrency
      // counts keys' runs of up to key_window messages each.
      p->options.concurrency = core::handler_in_flight_limit(p->kind, p->options);
      router_->set_kind(p->key, p->kind);
      router_->set_handler_limit(p->key, p->options.concurrency);
      if (p->kind == core::HandlerKind::Kafka)
        kafka.push_back(p->key);
      else
        http++;
    } else {
      notify++;
    }
    h.pipe = std::move(p);
    next.emplace(h.pipe->key, std::move(h));
  }
  handlers_ = std::move(next);
  kafka_sink_->retain_handlers(kafka);
  {
    std::lock_guard<std::mutex> lock(metrics_.mu);
    for (const auto& [id, h] : handlers_) metrics_.handlers[h.pipe->name];
  }
  log_info("handlers loaded", {{"notify", notify}, {"http", http}, {"kafka", kafka.size()}});
}

void Agent::serve_notify(Handler& h) {
  if (h.notify_policy.isolating()) {
    serve_notify_alone(h);
    return;
  }
  for (int round = 0; round < kNotifyRounds; round++) {
    long long n = 0;
    try {
      PgResult r = conn_.exec(
          "SELECT relay._agent_notify($1, $2, $3)",
          {std::to_string(h.pipe->key), std::to_string(cfg_.batch_size), std::to_string(cfg_.notify_payload_limit)});
      n = r.integer(0, 0);
    } catch (const PgError& e) {
      if (e.connection_lost) throw;
      // Its claim rolled back with it: how many it held is unknown, a batch at most.
      after_notify_error(h, e, cfg_.batch_size, nullptr);
      return;
    }
    h.notify_policy.after_success(false, static_cast<int>(n));
    if (n > 0) {
      log_debug("notified", {{"handler", h.pipe->name}, {"count", n}});
      std::lock_guard<std::mutex> lock(metrics_.mu);
      metrics_.handlers[h.pipe->name].notified += static_cast<uint64_t>(n);
    }
    if (n < cfg_.batch_size) {
      h.due = false;
      return;
    }
  }
}

void Agent::claim_sent(Handler& h, int64_t now) {
  const core::PipelineHandler& p = *h.pipe;
  const int room = claim_room(h, now);
  if (room <= 0) return;  // stays due: results make room
  const int want = std::min(room, cfg_.batch_size);
  // http: one delivery per key at a time, the next claimed once this one is
  // settled. kafka: a key's run of up to key_window at once, kept in order by
  // the sink (docs/kafka.md, "A busy key pipelined"); the key's next run
  // waits for this one's leases to end.
  PgResult r = conn_.exec(
      "SELECT id, event_id, topic, key, seq, payload, headers, attempt, published_ms, lease"
      " FROM relay._agent_claim($1, $2, $3, $4)",
      {std::to_string(p.key), std::to_string(want), std::to_string(h.lease_ms),
       std::to_string(core::effective_key_window(p.kind, p.options))});
  std::vector<core::ClaimedDelivery> claimed;
  claimed.reserve(r.rows());
  for (int i = 0; i < r.rows(); i++) {
    core::ClaimedDelivery d;
    core::WebhookMessage& m = d.message;
    m.id = r.integer(i, 0);
    m.event_id = r.integer(i, 1);
    m.topic = r.text(i, 2);
    m.has_key = !r.null(i, 3);
    if (m.has_key) {
      m.key = r.text(i, 3);
      m.seq = r.integer(i, 4);
    }
    m.payload_json = r.text(i, 5);
    if (!r.null(i, 6)) m.headers_json = r.text(i, 6);
    m.attempt = static_cast<int>(r.integer(i, 7));
    m.published_at_ms = r.integer(i, 8);
    d.published = m.published_at_ms;
    if (!core::parse_lease_token(r.text(i, 9), &d.receipt.a, &d.receipt.b)) {
      log_error("unreadable lease token", {{"id", m.id}, {"lease", r.text(i, 9)}});
      continue;  // its lease runs out and the delivery is claimed again
    }
    claimed.push_back(std::move(d));
  }
  h.due = r.rows() == want;
  if (claimed.empty()) return;
  log_debug("claimed", {{"handler", p.name}, {"count", claimed.size()}});
  pipeline_->enqueue(h.pipe, std::move(claimed),
                     now + core::http_queue_ms(h.lease_ms, p.options.timeout_ms, cfg_.http_lease_margin_ms));
}

int Agent::claim_room(const Handler& h, int64_t now) {
  const core::PipelineHandler& p = *h.pipe;
  if (!core::has_shared_limit(p.options)) return pipeline_->room(p.key, p.options.concurrency, now);
  return pipeline_->room(p.key, p.options.concurrency, limits_.claim_limits(p), now);
}

void Agent::sync_limits(int64_t now) {
  const int64_t due = limits_.next_sync_ms();
  if (due < 0 || now < due) return;
  std::map<int, const core::PipelineHandler*> limited;
  for (const auto& [id, h] : handlers_)
    if (h.pipe->kind != core::HandlerKind::Notify && core::has_shared_limit(h.pipe->options))
      limited.emplace(id, h.pipe.get());
  try {
    limits_.sync(conn_, limited, now);
  } catch (const PgError& e) {
    on_pg_error(e, "taking the handlers' limits", nullptr);
  }
}

void Agent::complete(const std::vector<core::Completion>& batch) {
  if (!conn_.ok()) throw PgError("", "not connected", true);
  std::vector<std::optional<std::string>> ids, leases, outcomes, retry, errors, statuses;
  for (const core::Completion& c : batch) {
    ids.emplace_back(std::to_string(c.id));
    leases.emplace_back(core::format_lease_token(c.receipt.a, c.receipt.b));
    outcomes.emplace_back(core::completion_outcome_name(c.outcome));
    retry.emplace_back(std::to_string(c.retry_in_ms));
    errors.emplace_back(c.error.empty() ? std::nullopt : std::optional<std::string>(c.error));
    statuses.emplace_back(std::to_string(c.status));
  }
  PgResult r = conn_.exec(
      "SELECT id, result FROM relay._agent_settle($1::bigint[], $2::uuid[], $3::text[], $4::bigint[], $5::text[],"
      " $6::integer[])",
      {array_literal(ids), array_literal(leases), array_literal(outcomes), array_literal(retry), array_literal(errors),
       array_literal(statuses)});
  std::map<int64_t, const core::Completion*> by_id;
  for (const core::Completion& c : batch) by_id[c.id] = &c;
  count_http_statuses(batch);
  for (int i = 0; i < r.rows(); i++) {
    const int64_t id = r.integer(i, 0);
    const std::string result = r.text(i, 1);
    auto found = by_id.find(id);
    if (found == by_id.end()) continue;
    const core::Completion& c = *found->second;
    if (result == "retry") due_after(c.handler_key, c.retry_in_ms);
    {
      std::lock_guard<std::mutex> lock(metrics_.mu);
      Metrics::PerHandler& m = metrics_.handlers[c.handler];
      (result == "stale" ? m.stale : result == "dead" ? m.dead : result == "retry" ? m.retried : m.delivered)++;
      if (c.send_ms >= 0) m.sends++;
      if (c.after_gap && result == "delivered") m.delivered_after_gap++;
      if (result == "delivered" && c.published > 0)
        m.latency.observe(std::max<int64_t>(0, wall_ms() - c.published) / 1000.0);
    }
    if (result == "stale") {
      log_warn("result not recorded: the lease is no longer held (it ran out or was taken over)",
               {{"id", id}, {"handler", c.handler}, {"outcome", core::completion_outcome_name(c.outcome)}});
    } else if (result == "dead") {
      log_warn("dead letter", {{"id", id}, {"handler", c.handler}, {"error", c.error}, {"status", c.status}});
    } else if (result == "retry") {
      log_info("retry", {{"id", id}, {"handler", c.handler}, {"error", c.error}, {"retry_in_ms", c.retry_in_ms}});
    } else {
      log_debug("delivered", {{"id", id}, {"handler", c.handler}});
    }
  }
  // A settled delivery may have been the head of its key: claim again.
  for (auto& [id, h] : handlers_)
    if (h.pipe->kind != core::HandlerKind::Notify) h.due = true;
}

void Agent::release(const std::vector<core::ClaimedDelivery>& never_sent) {
  if (never_sent.empty()) return;
  if (!conn_.ok()) throw PgError("", "not connected", true);
  std::vector<std::optional<std::string>> ids, leases;
  for (const core::ClaimedDelivery& d : never_sent) {
    ids.emplace_back(std::to_string(d.message.id));
    leases.emplace_back(core::format_lease_token(d.receipt.a, d.receipt.b));
  }
  PgResult r =
      conn_.exec("SELECT relay._agent_release($1::bigint[], $2::uuid[])", {array_literal(ids), array_literal(leases)});
  log_debug("released", {{"count", r.integer(0, 0)}});
}

void Agent::on_pg_error(const PgError& e, const char* what, Handler* h) {
  const int64_t now = wall_ms();
  if (e.connection_lost) {
    log_warn("connection lost", {{"while", what}, {"error", e.what()}});
    set_connected(false);
    {
      std::lock_guard<std::mutex> lock(metrics_.mu);
      metrics_.connections_lost++;
    }
    reconnect_at_ms_ = now;  // the first reconnect at once, then with backoff
    return;
  }
  {
    std::lock_guard<std::mutex> lock(metrics_.mu);
    metrics_.statement_errors++;
    metrics_.last_error = std::string(what) + " failed: " + e.what();
  }
  log_error(std::string(what) + " failed",
            {{"sqlstate", e.sqlstate},
             {"cause", core::error_cause_name(core::classify_error(e.sqlstate, e.what()))},
             {"error", e.what()},
             {"handler", h == nullptr ? "" : h->pipe->name}});
  if (h != nullptr) h->retry_at_ms = now + kHandlerErrorBackoffMs;
}

void Agent::set_connected(bool up) {
  if (!up) limits_.connection_lost();
  std::lock_guard<std::mutex> lock(metrics_.mu);
  metrics_.connected = up;
}

void Agent::publish_gauges() {
  std::lock_guard<std::mutex> lock(metrics_.mu);
  metrics_.in_flight = pipeline_->in_flight();
  if (spans_) {
    metrics_.spans_exported = spans_->exported();
    metrics_.spans_dropped = spans_->dropped();
  }
  for (const auto& [id, h] : handlers_) {
    if (h.pipe->kind == core::HandlerKind::Notify) continue;
    Metrics::PerHandler& m = metrics_.handlers[h.pipe->name];
    m.breaker_open = pipeline_->breaker_open(id);
    m.in_flight = router_->in_flight(id);
    const SharedLimits::View v = limits_.view(id, wall_ms());
    m.held_back = v.held_back;
    m.limit_slots = static_cast<uint64_t>(v.slots);
    m.limit_agents = static_cast<uint64_t>(v.agents);
    m.limited = v.limited;
  }
}

// The counters go into the database every report_interval_ms (docs/managed.md,
// "The agents' counters in the views"): one short statement on the loop's
// connection, outside any delivery's transaction. An edition without
// relay._agent_report (older than the agent) turns reporting off, said once.
void Agent::report(int64_t now) {
  if (report_off_ || cfg_.report_interval_ms <= 0 || now < next_report_ms_ || !conn_.ok()) return;
  next_report_ms_ = now + cfg_.report_interval_ms;
  try {
    conn_.exec(
        "SELECT relay._agent_report($1, $2, $3, $4::jsonb)",
        {report_name_, std::to_string(started_ms_), std::to_string(cfg_.report_interval_ms), metrics_.report_json()});
  } catch (const PgError& e) {
    if (e.sqlstate == "42883") {
      report_off_ = true;
      log_warn("this database's edition has no relay._agent_report (older than the agent): counters stay in /metrics",
               {{"error", e.what()}});
      return;
    }
    on_pg_error(e, "reporting counters", nullptr);
  }
}

void Agent::mark_all_due() {
  for (auto& [id, h] : handlers_) h.due = true;
}

// Every http attempt's status class, whatever became of its result (a stale
// one too), as the extension's workers count them.
void Agent::count_http_statuses(const std::vector<core::Completion>& batch) {
  std::lock_guard<std::mutex> lock(metrics_.mu);
  for (const core::Completion& c : batch) {
    auto it = handlers_.find(c.handler_key);
    if (it == handlers_.end() || it->second.pipe->kind != core::HandlerKind::Http) continue;
    metrics_.handlers[c.handler].http_status[c.status >= 100 && c.status < 600 ? c.status / 100 : 0]++;
  }
}

void Agent::due_after(int handler_key, int64_t in_ms) {
  auto it = handlers_.find(handler_key);
  if (it == handlers_.end()) return;
  const int64_t at = wall_ms() + std::max<int64_t>(0, in_ms);
  if (it->second.due_at_ms == 0 || at < it->second.due_at_ms) it->second.due_at_ms = at;
}

int64_t Agent::wait_ms(int64_t now) {
  int64_t t = cfg_.poll_interval_ms;
  if (conn_.ok()) {
    t = std::min(t, next_poll_ms_ - now);
    for (const auto& [id, h] : handlers_) {
      if (h.paused) continue;
      if (h.due_at_ms > 0) t = std::min(t, h.due_at_ms - now);
      if (h.retry_at_ms > now) {
        t = std::min(t, h.retry_at_ms - now);
        continue;
      }
      if (!h.due) continue;
      if (h.pipe->kind == core::HandlerKind::Notify) return 0;
      if (claim_room(h, now) > 0) return 0;
    }
    if (catalog_dirty_) t = std::min(t, catalog_retry_at_ms_ - now);
    const int64_t limits = limits_.next_sync_ms();
    if (limits >= 0) t = std::min(t, limits - now);
  } else {
    t = std::min(t, reconnect_at_ms_ - now);
  }
  const int64_t e = engine_->timeout_ms();
  if (e >= 0) t = std::min(t, e);
  // A pipelined kafka message's timeout is the sink's own (librdkafka never
  // times it out): poll the sink by then.
  const int64_t k = kafka_sink_->next_deadline_in_ms();
  if (k >= 0) t = std::min(t, k + 1);
  if (pipeline_->waiting() > 0) t = std::min<int64_t>(t, pipeline_->flush_paused(now) ? 100 : 2);
  if (pipeline_->queued() > 0) t = std::min<int64_t>(t, 100);
  const int64_t permit = pipeline_->next_permit_ms();
  if (permit >= 0) t = std::min(t, permit - now);
  const int64_t probe = pipeline_->next_probe_ms(now);
  if (probe >= 0) t = std::min(t, probe - now);
  const int64_t spans = spans_ ? spans_->wake_in_ms(now) : -1;
  if (spans >= 0) t = std::min(t, spans);
  return std::max<int64_t>(0, t);
}

void Agent::on_notifications(const std::vector<std::pair<std::string, std::string>>& notes) {
  for (const auto& [channel, payload] : notes) {
    if (channel != "relaybus") continue;
    if (payload == "catalog") {
      catalog_dirty_ = true;
      mark_all_due();
      continue;
    }
    auto it = handlers_.find(atoi(payload.c_str()));
    if (it != handlers_.end())
      it->second.due = true;
    else
      catalog_dirty_ = true;  // a handler this agent has not loaded yet
  }
}

void Agent::wait(int wake_fd, int64_t timeout_ms) {
  std::vector<std::pair<std::string, std::string>> queued;
  conn_.queued_notifications(&queued);
  if (!queued.empty()) {
    on_notifications(queued);
    timeout_ms = 0;
  }
  std::vector<pollfd> fds;
  fds.push_back({wake_fd, POLLIN, 0});
  const int pg_fd = conn_.ok() ? conn_.socket() : -1;
  if (pg_fd >= 0) fds.push_back({pg_fd, POLLIN, 0});
  // librdkafka's threads write this pipe when delivery reports wait; they are
  // served below, on this thread, without blocking.
  const size_t kafka_at = fds.size();
  fds.push_back({kafka_sink_->wait_fd(), POLLIN, 0});
  const size_t engine_from = fds.size();
  const int ready = engine_->ready_fd();
  std::vector<core::HttpEngine::SocketWant> wants;
  if (ready >= 0) {
    fds.push_back({ready, POLLIN, 0});
  } else {
    wants = engine_->sockets();
    for (const auto& w : wants)
      fds.push_back({w.fd, static_cast<short>((w.read ? POLLIN : 0) | (w.write ? POLLOUT : 0)), 0});
  }
  const int64_t e = engine_->timeout_ms();
  const int64_t engine_deadline = e >= 0 ? monotonic_ms() + e : -1;
  const int n = poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(timeout_ms, 60000)));
  if (n > 0) {
    if (fds[0].revents != 0) {
      char buf[64];
      while (read(wake_fd, buf, sizeof buf) > 0) {
      }
    }
    if (pg_fd >= 0 && fds[1].revents != 0) {
      std::vector<std::pair<std::string, std::string>> notes;
      if (!conn_.poll_notifications(&notes)) {
        log_warn("connection lost", {{"while", "waiting"}});
        reconnect_at_ms_ = wall_ms();
        set_connected(false);
        std::lock_guard<std::mutex> lock(metrics_.mu);
        metrics_.connections_lost++;
      }
      on_notifications(notes);
    }
    if (ready >= 0) {
      if (fds[engine_from].revents != 0) engine_->on_ready();
    } else {
      for (size_t i = engine_from; i < fds.size(); i++)
        if (fds[i].revents != 0)
          engine_->on_socket(fds[i].fd, (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0,
                             (fds[i].revents & (POLLOUT | POLLERR | POLLHUP)) != 0);
    }
  }
  if (engine_deadline >= 0 && monotonic_ms() >= engine_deadline) engine_->on_timeout();
  if ((n > 0 && fds[kafka_at].revents != 0) || kafka_sink_->next_deadline_in_ms() == 0) kafka_sink_->poll();
  for (const std::string& line : kafka_sink_->take_log()) log_warn(line);  // librdkafka's, and the gap rule's
}

int Agent::run(const std::atomic<bool>& stop, int wake_fd) {
  core::HttpEngineOptions eo;
  eo.max_total = cfg_.max_in_flight;
  eo.ca_file = cfg_.ca_file;
  std::string why;
  if (!core::parse_allowlist(cfg_.http_allowlist, &eo.allow, &why)) {
    log_error("invalid --http-allowlist", {{"error", why}});
    return kExitConfig;
  }
  engine_ = std::make_unique<core::HttpEngine>(eo);
  if (!engine_->ok()) {
    log_error("the HTTP engine could not start (libcurl)");
    return kExitRuntime;
  }
  sink_ = std::make_unique<core::HttpSink>(*engine_);
  kafka_sink_ = std::make_unique<core::KafkaSink>();
  // This loop polls the sink by its deadlines too (wait_ms, wait).
  kafka_sink_->set_pipelined(true);
  if (!kafka_sink_->ok()) {
    log_error("the kafka producers' wake-up pipe could not be made");
    return kExitRuntime;
  }
  router_ = std::make_unique<core::RoutingSink>(*sink_, *kafka_sink_);
  core::PipelineOptions po;
  po.max_in_flight = cfg_.max_in_flight;
  pipeline_ = std::make_unique<core::DeliveryPipeline>(*router_, po, std::random_device{}());
  if (!cfg_.otlp_endpoint.empty()) {
    core::SpanExporterOptions so;
    so.endpoint = cfg_.otlp_endpoint;
    so.headers = cfg_.otlp_headers;
    so.edition = "agent";
    spans_ = std::make_unique<core::SpanExporter>(std::move(so));
    pipeline_->set_span_exporter(spans_.get());
  }
  pipeline_->set_limiter(&limits_);
  MetricsServer metrics_server(metrics_);
  if (!cfg_.metrics_addr.empty()) {
    int port = 0;
    if (!metrics_server.start(cfg_.metrics_addr, &port, &why)) {
      log_error("invalid --metrics-addr", {{"error", why}});
      return kExitConfig;
    }
    log_info("metrics listening", {{"address", cfg_.metrics_addr}, {"port", port}});
  }
  log_info("relaybus-agent starting", {{"version", core::kVersion},
                                       {"poll_interval_ms", cfg_.poll_interval_ms},
                                       {"batch_size", cfg_.batch_size},
                                       {"http_allowlist", cfg_.http_allowlist}});

  int rc = kExitOk;
  bool draining = false;
  int64_t drain_deadline = 0;
  for (;;) {
    int64_t now = wall_ms();
    if (stop.load() && !draining) {
      draining = true;
      drain_deadline = now + cfg_.drain_timeout_ms;
      try {
        pipeline_->release_queued(*this);
      } catch (const PgError& e) {
        on_pg_error(e, "giving back queued deliveries", nullptr);
      }
      log_info("stopping", {{"in_flight", pipeline_->in_flight()}, {"drain_timeout_ms", cfg_.drain_timeout_ms}});
    }
    if (draining && ((pipeline_->in_flight() == 0 && pipeline_->waiting() == 0) || now >= drain_deadline)) break;
    if (!conn_.ok() && now >= reconnect_at_ms_) {
      const Connect c = connect_and_check();
      if (c == Connect::Fatal) {
        rc = kExitConfig;
        break;
      }
      if (c == Connect::Retry) {
        connect_failures_++;
        const int64_t delay =
            core::backoff_ceiling_ms({cfg_.reconnect_base_ms, cfg_.reconnect_max_ms}, connect_failures_);
        reconnect_at_ms_ = wall_ms() + delay;
        log_info("reconnecting later", {{"in_ms", delay}, {"failures", connect_failures_}});
      } else {
        set_connected(true);
        connect_failures_ = 0;
        catalog_dirty_ = true;
        next_poll_ms_ = 0;
      }
    }
    now = wall_ms();
    if (conn_.ok() && !draining) {
      if (catalog_dirty_ && now >= catalog_retry_at_ms_) {
        try {
          load_handlers();
          catalog_dirty_ = false;
        } catch (const PgError& e) {
          on_pg_error(e, "loading handlers", nullptr);
          catalog_retry_at_ms_ = wall_ms() + kHandlerErrorBackoffMs;
        }
      }
      if (now >= next_poll_ms_) {
        mark_all_due();
        next_poll_ms_ = now + cfg_.poll_interval_ms;
      }
      for (auto& [id, h] : handlers_) {
        if (h.due_at_ms > 0 && now >= h.due_at_ms) {
          h.due = true;
          h.due_at_ms = 0;
        }
      }
      if (conn_.ok()) sync_limits(now);
      for (auto& [id, h] : handlers_) {
        if (!conn_.ok()) break;
        if (h.paused || !h.due || now < h.retry_at_ms) continue;
        try {
          if (h.pipe->kind == core::HandlerKind::Notify)
            serve_notify(h);
          else
            claim_sent(h, wall_ms());
        } catch (const PgError& e) {
          on_pg_error(e, h.pipe->kind == core::HandlerKind::Notify ? "notify iteration" : "claim", &h);
        }
      }
    }
    try {
      pipeline_->pump(*this, wall_ms());
    } catch (const PgError& e) {
      on_pg_error(e, "giving back deliveries", nullptr);
    }
    pipeline_->collect(wall_ms());
    if (pipeline_->completion_due(wall_ms())) {
      try {
        pipeline_->flush(*this, wall_ms());
      } catch (const PgError& e) {
        on_pg_error(e, "settling results", nullptr);
      }
    }
    if (spans_) {
      spans_->pump(wall_ms());
      const std::string failed = spans_->take_error(wall_ms());
      if (!failed.empty())
        log_warn("span export failed; dropped spans are not sent again",
                 {{"endpoint", cfg_.otlp_endpoint}, {"error", failed}, {"dropped", spans_->dropped()}});
    }
    publish_gauges();
    if (!draining) report(wall_ms());
    wait(wake_fd, draining ? std::min<int64_t>(wait_ms(wall_ms()), 50) : wait_ms(wall_ms()));
  }
  if (pipeline_->waiting() > 0) {
    try {
      pipeline_->flush(*this, wall_ms());
    } catch (const PgError& e) {
      on_pg_error(e, "settling results", nullptr);
    }
  }
  if (pipeline_->in_flight() > 0) {
    log_warn("stopped with requests in flight: their leases run out and they are delivered again",
             {{"in_flight", pipeline_->in_flight()}});
    pipeline_->cancel_in_flight();
  }
  log_info("stopped", {{"exit_code", rc}});
  return rc;
}

}  // namespace relaybus::agent
