// Settling: the one way an attempt ends in relay.deliveries.
//
// Every completion (relay_ack, relay_nack, a fire-mode NOTIFY, the pipeline's
// results, a poison delivery, an expired lease's charge) first marks the
// leases it completes (leases_begin_completion, or leases_begin_charge), then
// hands its settlements here: one DELETE for the delivered, one UPDATE for the
// retries, one DELETE ... INSERT for the dead letters, and the counters. What
// a failure becomes is decided once: by core (the pipeline's classify_result)
// for a sent attempt, by judge_failures for the others; settle applies it.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

enum class SettleOutcome : uint8 { Delivered, Retry, Dead };

struct Settlement {
  int64 id;
  SettleOutcome outcome;
  int64 retry_in_ms;  // Retry: from now. For judge_failures: the caller's delay, or -1 (the backoff)
  const char* error;  // Retry, Dead: what happened (palloc'd or static); nullptr = none
  int32 status;       // the attempt's HTTP status, kept with a dead letter; 0 = none
  bool settled;       // out: the delivery existed and this settlement changed it
  int32 handler_id;   // out, when settled
};

// A delivered attempt.
inline Settlement settlement_delivered(int64 id) { return {id, SettleOutcome::Delivered, 0, nullptr, 0, false, 0}; }

// A failed attempt nobody judged yet (judge_failures makes it Retry or Dead):
// retry_in_ms the caller's delay, or -1 for the handler's backoff.
inline Settlement settlement_failed(int64 id, int64 retry_in_ms, const char* error) {
  return {id, SettleOutcome::Retry, retry_in_ms, error, 0, false, 0};
}

// A sent attempt, as core judged it.
inline Settlement settlement_judged(int64 id, SettleOutcome outcome, int64 retry_in_ms, const char* error,
                                    int32 status) {
  return {id, outcome, retry_in_ms, error, status, false, 0};
}

// Decides failed attempts that no pipeline judged (relay_nack, an expired
// lease, a poison delivery): each becomes Retry or Dead by core::decide_failure
// with the handler's current options and the delivery's attempt count. A
// settlement whose delivery is gone is left as it is (settle then finds
// nothing). Within spi_begin()/spi_end(), after the leases were marked.
void judge_failures(Settlement* s, int n);

// Within spi_begin()/spi_end(), after the leases were marked: applies the
// settlements (at most three statements, each for all of them), lowers the
// claim frontier for retries, and counts (delivered and pending at commit;
// retried and dead now, with their alerts). Sets settled and handler_id; returns how many settled.
int settle(Settlement* s, int n);

}  // namespace relaybus::pg
