// A dispatcher: one background worker per (database, worker index). It holds a
// share of the 64 lanes (leases in shared memory, renewed every loop, taken over
// from a dispatcher that stops renewing them) and hands the deliveries of those
// lanes to notify handlers:
//
//   one transaction: claim a batch per handler (the same rule as relay_claim),
//   pg_notify each delivery, delete the fire-and-forget ones; commit, so the
//   notifications and the completion become visible together.
//
// It sleeps on its latch, which publishers set when they commit; the poll
// interval is only a fallback.
//
// An error aborts the iteration and is charged to its cause (core/error_class):
//   - environmental (a lock or statement timeout, a serialization failure, a
//     full NOTIFY queue, lost lanes, ...): the iteration is retried after a
//     backoff and no delivery's attempts change;
//   - a delivery's data (or unknown): the deliveries in flight become
//     suspects, and the next iterations hand over one delivery in total, the
//     handlers taking turns, until one fails alone (it is nacked: retried with
//     backoff, then dead-lettered) or as many as were in flight went through
//     alone; then batches again. So a poison delivery never stalls or
//     crash-loops the worker, whichever handler it belongs to.

#include "core/backoff.hpp"
#include "core/error_class.hpp"
#include "pg/boundary.hpp"
#include "pg/claim.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/dedupe.hpp"
#include "pg/settle.hpp"
#include "pg/http_delivery.hpp"
#include "pg/leases.hpp"
#include "pg/notify_payload.hpp"
#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"
#include "pg/sched_slice.hpp"
#include "pg/session_settings.hpp"
#include "pg/settings.hpp"
#include "pg/worker_signals.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"
#include "pg/pending_counter.hpp"
#include "pg/worker_xact.hpp"

extern "C" {
#include "commands/async.h"
#include "commands/dbcommands.h"  // get_database_name (utils/lsyscache.h on 19)
#include "commands/extension.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/json.h"

PGDLLEXPORT void relay_dispatcher_main(Datum arg);
}

namespace relaybus::pg {

static int my_slot = -1;
static int my_db = -1;  // index in workers->databases
static int16 my_lanes[kNumLanes];
static uint64 my_tokens[kNumLanes];
static int my_nlanes = 0;

// Deliveries leased by the running iteration (with their lease tokens), so an
// error can give them back.
static int64* inflight = nullptr;
static LeaseToken* inflight_tokens = nullptr;
static int ninflight = 0;
static int inflight_cap = 0;
// Isolation after a delivery's error: while > 0, an iteration hands over one
// delivery in total; each that goes through alone counts one down.
static int isolation_left = 0;
static int isolation_turn = 0;  // the handler (in iteration order) whose turn is next
// Environmental errors in a row, and when the iteration may run again.
static int env_failures = 0;
static int64 retry_at_ms = 0;
static const core::BackoffPolicy kEnvironmentBackoff = {100, 5000};
// Epoch ms of the earliest not-yet-ready delivery the last iteration saw (0 =
// none): the wait ends then, so a retry goes out when its backoff ends rather
// than at the next poll.
static int64 next_ready_ms = 0;

// relay.dedupe cleanup (dedupe.hpp): every relaybus.dedupe_cleanup_interval, at most 1000 rows.
static int64 last_dedupe_cleanup_ms = 0;
static constexpr int kDedupeCleanupBatch = 1000;

static void note_next_ready(const ClaimResult* res) {
  if (res->next_ready_ms > 0 && (next_ready_ms == 0 || res->next_ready_ms < next_ready_ms))
    next_ready_ms = res->next_ready_ms;
}

static void remember_inflight(int64 id, const LeaseToken& token) {
  if (ninflight == inflight_cap) {
    int cap = inflight_cap == 0 ? 1024 : inflight_cap * 2;
    inflight = static_cast<int64*>(inflight == nullptr ? MemoryContextAlloc(TopMemoryContext, sizeof(int64) * cap)
                                                       : repalloc(inflight, sizeof(int64) * cap));
    inflight_tokens = static_cast<LeaseToken*>(inflight_tokens == nullptr
                                                   ? MemoryContextAlloc(TopMemoryContext, sizeof(LeaseToken) * cap)
                                                   : repalloc(inflight_tokens, sizeof(LeaseToken) * cap));
    inflight_cap = cap;
  }
  inflight_tokens[ninflight] = token;
  inflight[ninflight++] = id;
}

// A NOTIFY that waits for relay_ack carries its lease: `, "lease": "<uuid>"`
// (kLeaseFieldLen bytes) added to the JSON object text.
constexpr int kLeaseFieldLen = 49;
static char* with_lease(const char* json, const LeaseToken& token) {
  char text[37];
  lease_token_text(token, text);
  size_t len = strlen(json);
  while (len > 0 && json[len - 1] != '}') len--;
  if (len == 0) return pstrdup(json);
  return psprintf("%.*s, \"lease\": \"%s\"}", static_cast<int>(len - 1), json, text);
}

static void on_exit_release(int code, Datum) {
  LWLockReleaseAll();
  if (workers == nullptr || my_slot < 0) return;
  // Ended by SIGTERM (die) inside an iteration: its transaction is rolled
  // back, so what it leased goes back at once instead of when the leases lapse.
  leases_release(inflight, inflight_tokens, ninflight);
  ninflight = 0;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  if (my_db >= 0)
    for (int l = 0; l < kNumLanes; l++)
      if (workers->lanes[my_db][l].owner_slot == my_slot) workers->lanes[my_db][l].owner_slot = -1;
  DispatcherSlot& s = workers->slots[my_slot];
  s.pid = 0;  // the launcher frees the slot and starts another if one should run
  s.lanes_held = 0;
  LWLockRelease(workers->lock);
  wake_launcher();
}

// Renews this dispatcher's lanes and takes or gives lanes to hold a fair share.
static void balance_lanes() {
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz until = TimestampTzPlusMilliseconds(now, guc_lease_timeout_ms);
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  Oid dboid = workers->slots[my_slot].dboid;
  int active = 0;
  for (int s = 0; s < workers->nslots; s++) {
    const DispatcherSlot& o = workers->slots[s];
    if (o.dboid == dboid && o.pid != 0 &&
        (s == my_slot || o.heartbeat > TimestampTzPlusMilliseconds(now, -guc_lease_timeout_ms)))
      active++;
  }
  int fair = (kNumLanes + active - 1) / Max(active, 1);
  LaneLease* lanes = workers->lanes[my_db];
  int held = 0;
  for (int l = 0; l < kNumLanes; l++) {
    if (lanes[l].owner_slot != my_slot) continue;
    if (held >= fair) {
      lanes[l].owner_slot = -1;  // give the surplus to the others
      continue;
    }
    lanes[l].until = until;
    held++;
  }
  for (int l = 0; l < kNumLanes && held < fair; l++) {
    if (lanes[l].owner_slot == -1 || lanes[l].until < now) {
      lanes[l].owner_slot = my_slot;
      lanes[l].token = workers->next_token++;
      lanes[l].until = until;
      held++;
    }
  }
  my_nlanes = 0;
  for (int l = 0; l < kNumLanes; l++) {
    if (lanes[l].owner_slot == my_slot) {
      my_lanes[my_nlanes] = static_cast<int16>(l);
      my_tokens[my_nlanes++] = lanes[l].token;
    }
  }
  workers->slots[my_slot].heartbeat = now;
  workers->slots[my_slot].lanes_held = my_nlanes;
  LWLockRelease(workers->lock);
}

// The lanes a claim filters on: none while this dispatcher holds every lane
// (one dispatcher per database, the common case), so its scan reads the
// handler's rows without a `lane = ANY (64 lanes)` test per row. The same
// rows either way; lanes_still_mine() fences the iteration in both cases.
static void claim_lanes(ClaimRequest* req) {
  bool all = my_nlanes == kNumLanes;
  req->lanes = all ? nullptr : my_lanes;
  req->nlanes = all ? 0 : my_nlanes;
  req->use_floor = true;
  req->rescans = pg_atomic_read_u32(&workers->slots[my_slot].rescans);
}

// Fencing: completing is allowed only while every lane read is still ours.
static bool lanes_still_mine() {
  bool mine = true;
  LWLockAcquire(workers->lock, LW_SHARED);
  for (int i = 0; i < my_nlanes && mine; i++) {
    const LaneLease& l = workers->lanes[my_db][my_lanes[i]];
    mine = l.owner_slot == my_slot && l.token == my_tokens[i];
  }
  LWLockRelease(workers->lock);
  return mine;
}

// Hands one batch of a notify handler's deliveries over; returns how many.
static int dispatch_notify(const HandlerEntry* h) {
  bool ack = h->ack;
  ClaimRequest req = {};
  req.handler_id = h->id;
  req.max = isolation_left > 0 ? 1 : guc_batch_size;
  if (ack) {
    // Deliveries waiting for relay_ack count against relaybus.max_in_flight.
    int waiting = leases_count_handler(h->id, GetCurrentTimestamp());
    req.max = Min(req.max, guc_max_in_flight - waiting);
    if (req.max <= 0) return 0;
  }
  req.per_key = ack ? 1 : req.max;  // fire mode sends a key's run in order in one transaction
  req.lease_ms = h->lease_ms;
  claim_lanes(&req);
  // Ack mode: the lease waits for the consumer's relay_ack, and relay_claim of
  // the handler may take it over (a consumer draining at start).
  req.kind = ack ? LeaseKind::Notified : LeaseKind::Dispatcher;
  ClaimResult res;
  claim_deliveries(&req, &res);
  note_next_ready(&res);
  if (res.n == 0) return 0;
  // All of them at once: an error while sending must give every lease back.
  for (int i = 0; i < res.n; i++) remember_inflight(res.rows[i].id, res.rows[i].token);

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
    // Ack mode adds the lease field below: it counts against the limit.
    // "inline_payload": false sends every delivery by reference: any role
    // that can connect may LISTEN, only relay_consumer may call relay_payload.
    bool by_reference =
        !h->inline_payload || static_cast<int>(strlen(json)) + (ack ? kLeaseFieldLen : 0) > guc_notify_payload_limit;
    if (by_reference) {
      json = notify_reference_json(row);
      if (key != nullptr && !ack) held_keys[nheld++] = key;
    }
    // What the consumer completes carries the receipt it completes with.
    if (ack || by_reference) json = with_lease(json, row.token);
    Async_Notify(h->channel, json);
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

// Records that this database has no relaybus, unless a CREATE EXTENSION
// committed since `seen` was read (before the snapshot that found none).
static void mark_no_extension(uint64 seen) {
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->slots[my_slot].found_no_extension = true;
  workers->slots[my_slot].generation_seen = seen;
  LWLockRelease(workers->lock);
}

// relaybus's extension oid, looked up again only when a CREATE or DROP
// EXTENSION relaybus committed somewhere (workers->extension_generation) or an
// iteration failed: pg_extension has no syscache, and an index scan of it on
// every iteration was 4 % of a dispatcher's CPU at 1,000 events/s.
static Oid known_extension = InvalidOid;
static uint64 known_extension_generation = 0;

static Oid relaybus_extension(uint64 generation) {
  if (!OidIsValid(known_extension) || known_extension_generation != generation) {
    known_extension = get_extension_oid("relaybus", true);
    known_extension_generation = generation;
  }
  return known_extension;
}

// One pass over every notify handler; true if some handler had a full batch.
static bool iterate() {
  bool busy = false;
  next_ready_ms = 0;
  uint64 created_seen = workers->extension_generation;
  uint32 wakes_seen = pg_atomic_read_u32(&workers->slots[my_slot].wakes);
  pg_memory_barrier();
  worker_xact_begin();
  Oid extension = relaybus_extension(created_seen);
  if (!OidIsValid(extension)) {
    // Named, since the launcher checks every database: a log reader (and
    // test/integration/lifecycle.sh) must tell which one this was.
    char dbname[NAMEDATALEN] = "";
    const char* name = get_database_name(MyDatabaseId);
    if (name != nullptr) strlcpy(dbname, name, sizeof(dbname));
    worker_xact_commit();
    mark_no_extension(created_seen);
    ereport(LOG, (errmsg("relaybus dispatcher: extension not installed in database \"%s\", exiting", dbname)));
    proc_exit(0);
  }
  ensure_pending_counted(extension);
  pgstat_report_activity(STATE_RUNNING, "relaybus: dispatching");
  balance_lanes();

  // The handlers served here (a paused one waits): notify ones first, then http and kafka.
  int nh = catalog_handler_count();
  int32* ids = static_cast<int32*>(palloc(sizeof(int32) * (nh + 1)));
  int nserved = 0;
  // kafka handlers go with the http ones: the same pipeline sends both.
  int nkafka = 0;
  int32* kafka_ids = static_cast<int32*>(palloc(sizeof(int32) * (nh + 1)));
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < nh; i++) {
      const HandlerEntry* h = catalog_handler_at(i);
      if (h->paused) continue;
      bool notify = h->kind == core::HandlerKind::Notify;
      bool callout = h->kind == core::HandlerKind::Http || h->kind == core::HandlerKind::Kafka;
      if (pass == 0 ? notify : callout) ids[nserved++] = h->id;
      if (pass == 1 && h->kind == core::HandlerKind::Kafka) kafka_ids[nkafka++] = h->id;
    }
  }
  http_retain_kafka(kafka_ids, nkafka);
  bool isolating = isolation_left > 0;
  int handed = 0;
  if (nserved > 0 && my_nlanes > 0) {
    SpiScope scope;
    spi_begin(&scope);
    // Isolating, the handlers take turns at handing over the one delivery.
    int first = isolating ? isolation_turn % nserved : 0;
    for (int k = 0; k < nserved && !(isolating && handed > 0); k++) {
      int i = (first + k) % nserved;
      if (isolating) isolation_turn = i + 1;
      const HandlerEntry* h = catalog_handler_by_id(ids[i]);
      if (h == nullptr) continue;
      if (h->kind == core::HandlerKind::Notify) {
        int n = dispatch_notify(h);
        handed += n;
        if (n >= guc_batch_size) busy = true;
        continue;
      }
      int room = http_capacity(h);
      if (room <= 0) continue;
      ClaimRequest req = {};
      req.handler_id = h->id;
      req.max = Min(isolating ? 1 : guc_batch_size, room);
      req.per_key = 1;  // a key's next delivery waits for this one's success
      req.lease_ms = http_lease_ms(h);
      claim_lanes(&req);
      req.kind = LeaseKind::Dispatcher;
      ClaimResult res;
      claim_deliveries(&req, &res);
      note_next_ready(&res);
      for (int r = 0; r < res.n; r++) remember_inflight(res.rows[r].id, res.rows[r].token);
      http_stage(h, &res);
      handed += res.n;
    }
    spi_end(&scope);
  }
  // Dedupe rows past their window go now and then, a bounded batch at a time.
  int64 now_ms = timestamptz_to_epoch_ms(GetCurrentTimestamp());
  if (now_ms - last_dedupe_cleanup_ms >= guc_dedupe_cleanup_interval_ms) {
    last_dedupe_cleanup_ms = now_ms;
    dedupe_cleanup(kDedupeCleanupBatch);
  }
  if (handed > 0 && !lanes_still_mine())
    ereport(ERROR, (errcode(ERRCODE_LOCK_NOT_AVAILABLE),
                    errmsg("relaybus dispatcher lost its lanes during a batch; not completing it")));
  worker_xact_commit();
  pgstat_report_activity(STATE_IDLE, nullptr);
  // A publisher that committed after our snapshot asked for a wake-up; if a
  // lock wait in this iteration reset the latch, set it again so that the
  // next wait returns at once instead of at the poll interval.
  if (pg_atomic_read_u32(&workers->slots[my_slot].wakes) != wakes_seen) SetLatch(MyLatch);
  http_send_staged();  // only now, with no transaction open

  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->slots[my_slot].delivered += handed;
  LWLockRelease(workers->lock);
  ninflight = 0;
  env_failures = 0;
  // One more delivery went through alone; the next one goes at once.
  if (isolating && handed > 0) {
    isolation_left--;
    busy = true;
  }
  return busy;
}

// A delivery that failed alone is nacked in its own transaction, if this
// dispatcher still holds its lease.
static void nack_poison(MemoryContext cxt, int64 id, const LeaseToken& token, const char* message) {
  ErrorData* error = worker_step(cxt, [&] {
    worker_xact_begin();
    SpiScope scope;
    spi_begin(&scope);
    LeaseCheck check;
    const char* outcome = "lost its lease, not nacked";
    if (leases_begin_completion(&id, &token, nullptr, 1, GetCurrentTimestamp(), &check) == 1) {
      Settlement failed = settlement_failed(id, -1, message);
      judge_failures(&failed, 1);
      outcome = settle(&failed, 1) == 0 ? "gone" : failed.outcome == SettleOutcome::Dead ? "dead" : "retry";
    }
    spi_end(&scope);
    worker_xact_commit();
    ereport(LOG, (errmsg("relaybus dispatcher: delivery %lld failed alone (%s); %s", static_cast<long long>(id),
                         message, outcome[0] == 'd' ? "dead-lettered" : (outcome[0] == 'r' ? "will retry" : outcome))));
  });
  if (error == nullptr) return;
  ereport(LOG, (errcode(error->sqlerrcode), errmsg("relaybus dispatcher: could not nack delivery %lld: %s",
                                                   static_cast<long long>(id), error->message)));
  FreeErrorData(error);
}

// Charges the error that aborted an iteration to its cause (see the top).
static void after_error(MemoryContext cxt, ErrorData* ed) {
  http_drop_staged();
  known_extension = InvalidOid;  // dropped meanwhile, by a way that did not count? look again
  const char* message = ed->message != nullptr ? ed->message : "(no message)";
  core::ErrorCause cause = core::classify_error(unpack_sql_state(ed->sqlerrcode), message);
  // An error with nothing in flight cannot be any delivery's.
  bool environmental = cause == core::ErrorCause::Environment || ninflight == 0;
  ereport(LOG, (errmsg("relaybus dispatcher: iteration failed (cause: %s, SQLSTATE %s, %d in flight): %s",
                       core::error_cause_name(cause), unpack_sql_state(ed->sqlerrcode), ninflight, message)));
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->slots[my_slot].failed++;
  strlcpy(workers->slots[my_slot].last_error, message, sizeof(workers->slots[my_slot].last_error));
  LWLockRelease(workers->lock);
  int64 now_ms = timestamptz_to_epoch_ms(GetCurrentTimestamp());
  if (environmental) {
    // Nobody's fault: the same iteration again after a backoff.
    leases_release(inflight, inflight_tokens, ninflight);
    env_failures++;
    retry_at_ms = now_ms + core::backoff_ceiling_ms(kEnvironmentBackoff, env_failures);
    FreeErrorData(ed);
    ninflight = 0;
    return;
  }
  retry_at_ms = now_ms + kEnvironmentBackoff.base_ms;  // a short pause, then isolate
  if (isolation_left > 0 && ninflight == 1) {
    nack_poison(cxt, inflight[0], inflight_tokens[0], message);
    isolation_left = 0;  // found: batches again
  } else {
    leases_release(inflight, inflight_tokens, ninflight);
    isolation_left = Max(ninflight, 1);
  }
  ninflight = 0;
  FreeErrorData(ed);
}

// Requests still in flight when the dispatcher stops (disabled, SIGTERM) get a
// short while to finish, and what finished is completed: otherwise every
// reload or restart would send up to `concurrency` deliveries again that the
// receiver already has. Bounded, so a slow endpoint never holds a shutdown up.
static void drain_http_on_exit(MemoryContext cxt) {
  constexpr int64 kDrainMs = 3000;
  int64 deadline = timestamptz_to_epoch_ms(GetCurrentTimestamp()) + kDrainMs;
  ErrorData* error = worker_step(cxt, [&] {
    for (;;) {
      int64 left = deadline - timestamptz_to_epoch_ms(GetCurrentTimestamp());
      if (http_in_flight() == 0 || left <= 0) break;
      (void)http_wait(static_cast<long>(Min(left, static_cast<int64>(50))));
      MemoryContextReset(cxt);
    }
    http_complete();
  });
  if (error == nullptr) return;
  ereport(LOG, (errcode(error->sqlerrcode),
                errmsg("relaybus dispatcher: could not complete the requests in flight at exit: %s", error->message)));
  FreeErrorData(error);
}

}  // namespace relaybus::pg

using namespace relaybus::pg;

extern "C" void relay_dispatcher_main(Datum) {
  DispatcherArgs args;
  memcpy(&args, MyBgworkerEntry->bgw_extra, sizeof(args));
  install_dispatcher_signals();

  if (workers == nullptr || args.slot < 0 || args.slot >= workers->nslots || args.epoch != workers->epoch)
    proc_exit(0);  // started before a crash-restart: the new launcher starts its own
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  DispatcherSlot& slot = workers->slots[args.slot];
  Oid dboid = slot.dboid;
  // A slot given to another since (launcher restart), or a database that DDL
  // keeps out (DROP DATABASE ...): leave at once.
  bool taken = (slot.pid != 0 && slot.pid != MyProcPid) || slot.ticket != args.ticket || database_kept_out(dboid);
  if (!taken && dboid != InvalidOid) {
    slot.pid = MyProcPid;
    slot.pgprocno = relaybus_procno();
    slot.started_at = GetCurrentTimestamp();
    slot.heartbeat = slot.started_at;
    my_slot = args.slot;
    my_db = database_slot(dboid, true);
  }
  LWLockRelease(workers->lock);
  if (my_slot < 0 || my_db < 0) proc_exit(0);
  before_shmem_exit(on_exit_release, 0);

  BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
  pgstat_report_appname("relaybus dispatcher");

  MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "relaybus dispatcher", ALLOCSET_DEFAULT_SIZES);
  worker_xact_set_loop_context(cxt);
  pin_session_settings();
  (void)request_time_slice(guc_dispatcher_time_slice_us);
  // Responses trickle in one socket event at a time; completing and claiming
  // per response would cost two transactions per delivery. Results wait for
  // a batch (or 2 ms, or the last one in flight), and an iteration runs only
  // when woken, after a completion, or while busy.
  constexpr int64 kCompleteDelayMs = 2;  // the pipeline's batching delay
  bool run_iteration = true;
  // Asked to stop by the launcher: the unlocked read sees it at the latest
  // on the next wake-up, which the launcher sends after setting it.
  auto stop_requested = [] { return workers->slots[my_slot].stop_requested_at != 0; };
  while (!got_sigterm && !stop_requested()) {
    if (ConfigReloadPending) {
      ConfigReloadPending = false;
      ProcessConfigFile(PGC_SIGHUP);
      pin_session_settings();
      (void)request_time_slice(guc_dispatcher_time_slice_us);
    }
    if (!guc_enabled) break;
    bool busy = false;
    MemoryContextSwitchTo(cxt);
    ErrorData* error = worker_step(cxt, [&] {
      http_pump();  // claimed requests go out as soon as responses made room
      int ready = http_collect();
      if (ready > 0 && (run_iteration || http_completion_due())) {
        http_complete();
        run_iteration = true;
      }
      // After an environmental error, the iteration waits for its backoff.
      if (run_iteration && !got_sigterm && !stop_requested() &&
          timestamptz_to_epoch_ms(GetCurrentTimestamp()) >= retry_at_ms) {
        run_iteration = false;
        busy = iterate();
      }
    });
    if (error != nullptr) after_error(cxt, error);
    MemoryContextReset(cxt);
    if (busy) {
      run_iteration = true;
      CHECK_FOR_INTERRUPTS();
      continue;
    }
    long timeout = static_cast<long>(guc_poll_interval_ms);
    int64 backoff_left = retry_at_ms - timestamptz_to_epoch_ms(GetCurrentTimestamp());
    if (backoff_left > 0) timeout = static_cast<long>(Max(1, Min(static_cast<int64>(timeout), backoff_left)));
    if (next_ready_ms > 0) {
      int64 until = next_ready_ms - timestamptz_to_epoch_ms(GetCurrentTimestamp()) + 1;
      timeout = static_cast<long>(Max(1, Min(static_cast<int64>(timeout), until)));
    }
    if (http_collect() > 0) timeout = Min(timeout, static_cast<long>(kCompleteDelayMs));
    run_iteration = http_wait(timeout) || run_iteration;
    MemoryContextReset(cxt);
    CHECK_FOR_INTERRUPTS();
  }
  MemoryContextSwitchTo(cxt);
  // A database that DDL keeps out (DROP DATABASE ...) needs us gone, not our
  // completions (a request may hang in its name lookup or on a slow receiver).
  LWLockAcquire(workers->lock, LW_SHARED);
  bool kept_out = database_kept_out(dboid);
  LWLockRelease(workers->lock);
  if (!kept_out) drain_http_on_exit(cxt);
  http_shutdown();
  proc_exit(0);
}
