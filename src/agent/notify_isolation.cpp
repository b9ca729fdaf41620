// Poison isolation for notify handlers (docs/managed.md, "Poison isolation"):
// core::DispatchPolicy, as the extension's dispatcher applies it
// (src/pg/dispatch_recovery.cpp), for relay._agent_notify. A failed iteration
// rolls back whole, its claim included, so a suspect is sent alone under a
// lease the agent took itself (relay._agent_claim): if it fails, that lease
// names the delivery to nack.

#include <random>

#include "agent/agent.hpp"
#include "core/clock.hpp"
#include "core/error_class.hpp"
#include "core/json_log.hpp"
#include "core/lease_token.hpp"
#include "core/webhook_delivery.hpp"

namespace relaybus::agent {

using core::log_debug;
using core::log_error;
using core::log_info;
using core::log_warn;

namespace {

const char* after_error_name(core::AfterError a) {
  switch (a) {
    case core::AfterError::Backoff:
      return "back off";
    case core::AfterError::Isolate:
      return "send one at a time";
    case core::AfterError::NackPoison:
      return "nack the delivery";
  }
  return "?";
}

}  // namespace

void Agent::after_notify_error(Handler& h, const PgError& e, int in_flight, const core::ClaimedDelivery* suspect) {
  const core::ErrorCause cause = core::classify_error(e.sqlstate, e.what());
  const int64_t now = core::wall_ms();
  const core::AfterError after = h.notify_policy.after_error(cause, in_flight, now);
  h.retry_at_ms = h.notify_policy.retry_at_ms();
  {
    std::lock_guard<std::mutex> lock(metrics_.mu);
    metrics_.statement_errors++;
  }
  log_error("notify iteration failed", {{"handler", h.pipe->name},
                                        {"sqlstate", e.sqlstate},
                                        {"cause", core::error_cause_name(cause)},
                                        {"error", e.what()},
                                        {"in_flight", in_flight},
                                        {"then", after_error_name(after)},
                                        {"retry_in_ms", h.retry_at_ms - now}});
  if (suspect == nullptr) return;
  if (after != core::AfterError::NackPoison) {
    release({*suspect});  // nobody's attempt is charged
    return;
  }
  static std::mt19937_64 rng{std::random_device{}()};
  const core::FailureDecision d = core::decide_failure(h.pipe->options, false, suspect->message.attempt, -1, rng());
  core::Completion c;
  c.id = suspect->message.id;
  c.receipt = suspect->receipt;
  c.handler_key = h.pipe->key;
  c.handler = h.pipe->name;
  c.outcome = d.dead ? core::CompletionOutcome::Dead : core::CompletionOutcome::Retry;
  c.retry_in_ms = d.retry_in_ms;
  c.error = e.what();
  c.published = suspect->published;
  log_warn("delivery failed alone",
           {{"id", c.id}, {"handler", c.handler}, {"attempt", suspect->message.attempt}, {"error", c.error}});
  complete({c});
}

void Agent::serve_notify_alone(Handler& h) {
  const core::PipelineHandler& p = *h.pipe;
  core::ClaimedDelivery d;
  try {
    // The handler's lease, as a delivery sent by reference or in ack mode
    // keeps it after the NOTIFY.
    PgResult r = conn_.exec("SELECT id, lease, attempt, published_ms FROM relay._agent_claim($1, 1, $2, 1)",
                            {std::to_string(p.key), std::to_string(p.options.lease_ms)});
    if (r.rows() == 0) {
      h.notify_policy.suspects_gone();
      h.due = false;
      log_info("poison isolation over: nothing left to send alone", {{"handler", p.name}});
      return;
    }
    d.message.id = r.integer(0, 0);
    d.message.attempt = static_cast<int>(r.integer(0, 2));
    d.published = r.integer(0, 3);
    if (!core::parse_lease_token(r.text(0, 1), &d.receipt.a, &d.receipt.b)) {
      log_error("unreadable lease token", {{"id", d.message.id}, {"lease", r.text(0, 1)}});
      return;  // its lease runs out and the delivery is claimed again
    }
  } catch (const PgError& e) {
    if (e.connection_lost) throw;
    after_notify_error(h, e, 0, nullptr);
    return;
  }
  try {
    PgResult r = conn_.exec("SELECT relay._agent_notify($1, 1, $2, $3, $4)",
                            {std::to_string(p.key), std::to_string(cfg_.notify_payload_limit),
                             std::to_string(d.message.id), core::format_lease_token(d.receipt.a, d.receipt.b)});
    const long long n = r.integer(0, 0);
    log_debug("notified", {{"handler", p.name}, {"count", n}, {"alone", true}});
    {
      std::lock_guard<std::mutex> lock(metrics_.mu);
      metrics_.handlers[p.name].notified += static_cast<uint64_t>(n);
    }
    // Sent, or its lease ran out meanwhile: either way one suspect fewer.
    h.notify_policy.after_success(true, 1);
  } catch (const PgError& e) {
    if (e.connection_lost) throw;
    after_notify_error(h, e, 1, &d);
  }
}

}  // namespace relaybus::agent
