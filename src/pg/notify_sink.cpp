#include "pg/notify_sink.hpp"

#include "pg/cpp/pipeline_host.h"
#include "pg/dispatch_lanes.hpp"
#include "pg/notify_payload.hpp"
#include "pg/settings.hpp"
#include "pg/settle.hpp"
#include "pg/trace_context.hpp"

extern "C" {
#include "commands/async.h"
}

namespace relaybus::pg {

namespace {

// A NOTIFY that waits for relay_ack carries its lease: `, "lease": "<uuid>"`
// (kLeaseFieldLen bytes) added to the JSON object text; one of an event with
// a trace context its attempt's `, "traceparent": "..."` (kTraceFieldLen + the
// value), so that events without one keep their payloads byte for byte.
constexpr int kLeaseFieldLen = 49;
constexpr int kTraceFieldLen = 19;
char* with_field(const char* json, const char* name, const char* value) {
  size_t len = strlen(json);
  while (len > 0 && json[len - 1] != '}') len--;
  if (len == 0) return pstrdup(json);
  return psprintf("%.*s, \"%s\": \"%s\"}", static_cast<int>(len - 1), json, name, value);
}
char* with_lease(const char* json, const LeaseToken& token) {
  char text[37];
  lease_token_text(token, text);
  return with_field(json, "lease", text);
}

}  // namespace

int dispatch_notify(DispatcherState* st, const HandlerEntry* h) {
  bool ack = h->ack;
  ClaimRequest req = {};
  req.handler_id = h->id;
  req.max = st->policy.batch_max(guc_batch_size);
  if (ack) {
    // Deliveries waiting for relay_ack count against relaybus.max_in_flight.
    int waiting = leases_count_handler(h->id, GetCurrentTimestamp());
    req.max = Min(req.max, guc_max_in_flight - waiting);
    if (req.max <= 0) return 0;
  }
  req.per_key = ack ? 1 : req.max;  // fire mode sends a key's run in order in one transaction
  req.lease_ms = h->lease_ms;
  claim_lanes(st, &req);
  // Ack mode: the lease waits for the consumer's relay_ack, and relay_claim of
  // the handler may take it over (a consumer draining at start).
  req.kind = ack ? LeaseKind::Notified : LeaseKind::Dispatcher;
  ClaimResult res;
  claim_deliveries(&req, &res);
  note_next_ready(st, &res);
  if (res.n == 0) return 0;
  // All of them at once: an error while sending must give every lease back.
  for (int i = 0; i < res.n; i++) remember_inflight(st, res.rows[i].id, res.rows[i].token);

  Settlement* done = static_cast<Settlement*>(palloc(sizeof(Settlement) * res.n));
  int64* done_ids = static_cast<int64*>(palloc(sizeof(int64) * res.n));
  LeaseToken* done_tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * res.n));
  int ndone = 0;
  // A delivery sent by reference stays until acked, so its key's run stops
  // there: the rest of the run goes back unsent (their leases are released).
  const char** held_keys = static_cast<const char**>(palloc(sizeof(char*) * res.n));
  int nheld = 0;
  int64* unsent = static_cast<int64*>(palloc(sizeof(int64) * res.n));
  LeaseToken* unsent_tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * res.n));
  int nunsent = 0;
  const bool spans = host_otlp_on();
  for (int i = 0; i < res.n; i++) {
    const ClaimedRow& row = res.rows[i];
    const char* key = row.key;
    bool held = false;
    for (int k = 0; key != nullptr && k < nheld && !held; k++) held = strcmp(held_keys[k], key) == 0;
    if (held) {
      unsent_tokens[nunsent] = row.token;
      unsent[nunsent++] = row.id;
      continue;
    }
    char* json = notify_payload_json(row);
    char* stored_traceparent = nullptr;
    char* traceparent = handover_traceparent(row.headers, &stored_traceparent);
    const int trace_len = traceparent == nullptr ? 0 : kTraceFieldLen + static_cast<int>(strlen(traceparent));
    // Ack mode adds the lease field below, a traced event its traceparent:
    // they count against the limit.
    // "inline_payload": false sends every delivery by reference: any role
    // that can connect may LISTEN, only relay_consumer may call relay_payload.
    const int inline_len = static_cast<int>(strlen(json)) + (ack ? kLeaseFieldLen : 0) + trace_len;
    bool by_reference = !h->inline_payload || inline_len > guc_notify_payload_limit;
    if (by_reference) {
      json = notify_reference_json(row);
      if (key != nullptr && !ack) held_keys[nheld++] = key;
    }
    if (traceparent != nullptr) json = with_field(json, "traceparent", traceparent);
    // What the consumer completes carries the receipt it completes with.
    if (ack || by_reference) json = with_lease(json, row.token);
    Async_Notify(h->channel, json);
    if (traceparent != nullptr && spans)
      host_otlp_stage_notify(h->name, h->channel, row.id, row.attempt, traceparent, stored_traceparent,
                             ack || by_reference);
    if (!ack && !by_reference) {
      done_ids[ndone] = row.id;
      done_tokens[ndone] = row.token;
      done[ndone++] = settlement_delivered(row.id);
    }
  }
  leases_release(unsent, unsent_tokens, nunsent);
  if (ndone > 0) {
    // Fire mode completes in this transaction: compare-and-mark with the
    // tokens of this claim. A lease lost meanwhile (this worker stalled past
    // it) fails the iteration, so its NOTIFYs are not sent either.
    LeaseCheck* checks = static_cast<LeaseCheck*>(palloc(sizeof(LeaseCheck) * ndone));
    if (leases_begin_completion(done_ids, done_tokens, nullptr, ndone, GetCurrentTimestamp(), checks) != ndone)
      ereport(ERROR, (errcode(ERRCODE_LOCK_NOT_AVAILABLE),
                      errmsg("relaybus dispatcher lost the lease of a delivery during a batch; not completing it")));
    (void)settle(done, ndone);
  }
  return res.n - nunsent;
}

}  // namespace relaybus::pg
