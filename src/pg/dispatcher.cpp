// A dispatcher: one background worker per (database, worker index), in
// pg_cron's shape: one loop over one state struct (dispatcher_state.hpp),
// read top to bottom in named phases, each concept in a file of its own:
//
//   lanes               dispatch_lanes.cpp: its share of the 64 lanes, fencing
//   claim and stage     notify_sink.cpp (NOTIFY, settled in the same
//                       transaction); http_delivery.cpp and cpp/pipeline_host
//                       (http and kafka, sent after it commits)
//   send, collect,      http_delivery.cpp: the pipeline host's glue
//   settle
//   spans               http_delivery.cpp's otlp_pump over core/span_exporter.hpp
//   wait                wait_set.cpp: latch, sockets, timers
//   errors              dispatch_recovery.cpp over core/dispatch_policy.hpp:
//                       an environmental error backs off, a delivery's is
//                       isolated and its poison nacked
//
// It sleeps on its latch, which publishers set when they commit; the poll
// interval is only a fallback.

#include "pg/boundary.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/claim.hpp"
#include "pg/dedupe.hpp"
#include "pg/dispatch_lanes.hpp"
#include "pg/dispatch_recovery.hpp"
#include "pg/dispatcher_state.hpp"
#include "pg/http_delivery.hpp"
#include "pg/notify_sink.hpp"
#include "pg/pending_counter.hpp"
#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"
#include "pg/sched_slice.hpp"
#include "pg/session_settings.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/wait_set.hpp"
#include "pg/worker_signals.hpp"
#include "pg/worker_state.hpp"
#include "pg/worker_xact.hpp"

extern "C" {
#include "commands/dbcommands.h"  // get_database_name (utils/lsyscache.h on 19)
#include "commands/extension.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"

PGDLLEXPORT void relay_dispatcher_main(Datum arg);
}

namespace relaybus::pg {

// The one dispatcher of this process; on_exit_release needs it too.
static DispatcherState state;

// relay.dedupe cleanup (dedupe.hpp): every relaybus.dedupe_cleanup_interval, at most 1000 rows.
static constexpr int kDedupeCleanupBatch = 1000;
// Responses trickle in one socket event at a time; completing and claiming
// per response would cost two transactions per delivery. Results wait for a
// batch (or 2 ms, or the last one in flight), and an iteration runs only when
// woken, after a completion, or while busy.
static constexpr int64 kCompleteDelayMs = 2;  // the pipeline's batching delay

static int64 now_ms() { return timestamptz_to_epoch_ms(GetCurrentTimestamp()); }

static void on_exit_release(int code, Datum arg) {
  DispatcherState* st = reinterpret_cast<DispatcherState*>(DatumGetPointer(arg));
  LWLockReleaseAll();
  if (workers == nullptr || st->slot < 0) return;
  // Ended by SIGTERM (die) inside an iteration: its transaction is rolled
  // back, so what it leased goes back at once instead of when the leases lapse.
  release_inflight(st);
  http_limits_exit();
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  lanes_free_locked(st);
  DispatcherSlot& s = workers->slots[st->slot];
  s.pid = 0;  // the launcher frees the slot and starts another if one should run
  s.lanes_held = 0;
  LWLockRelease(workers->lock);
  wake_launcher();
}

// Startup: takes the slot the launcher reserved (or exits), connects, and
// returns the loop's memory context.
static MemoryContext start(DispatcherState* st) {
  DispatcherArgs args;
  memcpy(&args, MyBgworkerEntry->bgw_extra, sizeof(args));
  install_dispatcher_signals();

  if (workers == nullptr || args.slot < 0 || args.slot >= workers->nslots || args.epoch != workers->epoch)
    proc_exit(0);  // started before a crash-restart: the new launcher starts its own
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  DispatcherSlot& slot = workers->slots[args.slot];
  st->dboid = slot.dboid;
  // A slot given to another since (launcher restart), or a database that DDL
  // keeps out (DROP DATABASE ...): leave at once.
  bool taken = (slot.pid != 0 && slot.pid != MyProcPid) || slot.ticket != args.ticket || database_kept_out(st->dboid);
  if (!taken && st->dboid != InvalidOid) {
    slot.pid = MyProcPid;
    slot.pgprocno = relaybus_procno();
    slot.started_at = GetCurrentTimestamp();
    slot.heartbeat = slot.started_at;
    st->slot = args.slot;
    st->db = database_slot(st->dboid, true);
  }
  int share = slot.worker_index;
  LWLockRelease(workers->lock);
  if (st->slot < 0 || st->db < 0) proc_exit(0);
  before_shmem_exit(on_exit_release, PointerGetDatum(st));
  http_limits_start(st->dboid, share);

  BackgroundWorkerInitializeConnectionByOid(st->dboid, InvalidOid, 0);
  pgstat_report_appname("relaybus dispatcher");

  MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "relaybus dispatcher", ALLOCSET_DEFAULT_SIZES);
  worker_xact_set_loop_context(cxt);
  pin_session_settings();
  (void)request_time_slice(guc_dispatcher_time_slice_us);
  return cxt;
}

// Asked to stop by SIGTERM or by the launcher: the unlocked read of the
// latter sees it at the latest on the next wake-up, which the launcher sends
// after setting it.
static bool stopping(const DispatcherState* st) {
  return got_sigterm || workers->slots[st->slot].stop_requested_at != 0;
}

// Reload: false once relaybus.enabled is off.
static bool reload_settings() {
  if (ConfigReloadPending) {
    ConfigReloadPending = false;
    ProcessConfigFile(PGC_SIGHUP);
    pin_session_settings();
    (void)request_time_slice(guc_dispatcher_time_slice_us);
  }
  return guc_enabled;
}

// Collect and settle: finished requests are completed in a batch, or at once
// when an iteration is due anyway.
static void collect_and_settle(DispatcherState* st) {
  int ready = http_collect();
  if (ready > 0 && (st->run_iteration || http_completion_due())) {
    http_complete();
    st->run_iteration = true;
  }
}

// Records that this database has no relaybus, unless a CREATE EXTENSION
// committed since `seen` was read (before the snapshot that found none).
static void mark_no_extension(const DispatcherState* st, uint64 seen) {
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->slots[st->slot].found_no_extension = true;
  workers->slots[st->slot].generation_seen = seen;
  LWLockRelease(workers->lock);
}

// Opens the iteration's transaction; exits if relaybus is not installed here.
static void begin_iteration(DispatcherState* st) {
  st->next_ready_ms = 0;
  uint64 created_seen = workers->extension_generation;
  st->wakes_seen = pg_atomic_read_u32(&workers->slots[st->slot].wakes);
  pg_memory_barrier();
  worker_xact_begin();
  if (!OidIsValid(st->known_extension) || st->known_extension_generation != created_seen) {
    st->known_extension = get_extension_oid("relaybus", true);
    st->known_extension_generation = created_seen;
  }
  if (!OidIsValid(st->known_extension)) {
    // Named, since the launcher checks every database: a log reader (and
    // test/integration/lifecycle.sh) must tell which one this was.
    char dbname[NAMEDATALEN] = "";
    const char* name = get_database_name(MyDatabaseId);
    if (name != nullptr) strlcpy(dbname, name, sizeof(dbname));
    worker_xact_commit();
    mark_no_extension(st, created_seen);
    ereport(LOG, (errmsg("relaybus dispatcher: extension not installed in database \"%s\", exiting", dbname)));
    proc_exit(0);
  }
  ensure_pending_counted(st->known_extension);
  pgstat_report_activity(STATE_RUNNING, "relaybus: dispatching");
}

// The handlers served (a paused one waits) into ids: notify ones first, then
// http and kafka; the kafka ones keep their producers.
static int served_handlers(int32* ids, int32* kafka_ids) {
  int nh = catalog_handler_count();
  int nserved = 0, nkafka = 0;
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
  return nserved;
}

// Claims a batch of an http or kafka handler's deliveries and stages them for
// the pipeline, to be sent once the transaction commits; returns how many.
static int claim_callouts(DispatcherState* st, const HandlerEntry* h) {
  int room = http_capacity(h);
  if (room <= 0) return 0;
  ClaimRequest req = {};
  req.handler_id = h->id;
  req.max = Min(st->policy.batch_max(guc_batch_size), room);
  // A key's next run waits for this one's end; a kafka handler's run is
  // produced at once (its sink keeps it in order: docs/kafka.md).
  req.per_key = Max(1, h->key_window);
  req.lease_ms = http_lease_ms(h);
  claim_lanes(st, &req);
  req.kind = LeaseKind::Dispatcher;
  ClaimResult res;
  claim_deliveries(&req, &res);
  note_next_ready(st, &res);
  for (int r = 0; r < res.n; r++) remember_inflight(st, res.rows[r].id, res.rows[r].token);
  http_stage(h, &res);
  return res.n;
}

// Ends the open part of an iteration: its claims are fenced by the lanes
// still being this dispatcher's, committed, then sent.
static void commit_and_send(DispatcherState* st, int handed) {
  if (handed > 0 && !lanes_still_mine(st))
    ereport(ERROR, (errcode(ERRCODE_LOCK_NOT_AVAILABLE),
                    errmsg("relaybus dispatcher lost its lanes during a batch; not completing it")));
  worker_xact_commit();
  pgstat_report_activity(STATE_IDLE, nullptr);
  http_send_staged();  // only now, with no transaction open
  otlp_notify_sent();
  st->ninflight = 0;  // in the pipeline now: an error later must not give them back
}

// Claim and stage, over every handler served; returns how many were handed
// over, *busy if a notify handler had a full batch. Isolating, the handlers
// take turns at handing over the one delivery. The busy handlers (http and
// kafka ones with deliveries out already, queued or in flight here; notify
// ones whose last batch was full) come last, after a commit and send of the
// others' claims when there were any: a quiet handler's new event does not
// wait for a busy handler's batch of hundreds (docs/scaling.md, "Fairness
// between handlers"); without a busy handler, an iteration stays one
// transaction.
static int claim_and_stage(DispatcherState* st, bool* busy) {
  // In the loop's context, not the transaction's: the commit before the busy
  // handlers' turns frees the transaction's memory, and the turns after it
  // still read these.
  MemoryContext loop = worker_loop_context();
  int nh = catalog_handler_count();
  int32* ids = static_cast<int32*>(MemoryContextAlloc(loop, sizeof(int32) * (nh + 1)));
  int32* kafka_ids = static_cast<int32*>(MemoryContextAlloc(loop, sizeof(int32) * (nh + 1)));
  int nserved = served_handlers(ids, kafka_ids);
  if (nserved == 0 || st->nlanes == 0) return 0;
  bool isolating = st->policy.isolating();
  int first = st->policy.first_handler(nserved);
  // The turns in rotation order, the busy callouts moved after the others.
  int* order = static_cast<int*>(MemoryContextAlloc(loop, sizeof(int) * nserved));
  bool* out_already = static_cast<bool*>(MemoryContextAllocZero(loop, sizeof(bool) * nserved));
  int nquiet = 0;
  for (int k = 0; k < nserved; k++) {
    int i = (first + k) % nserved;
    const HandlerEntry* h = catalog_handler_by_id(ids[i]);
    if (h != nullptr)
      out_already[i] = h->kind == core::HandlerKind::Notify ? notify_busy(st, h->id) : http_outstanding(h) > 0;
    if (!out_already[i]) order[nquiet++] = i;
  }
  for (int k = 0, n = nquiet; k < nserved; k++) {
    int i = (first + k) % nserved;
    if (out_already[i]) order[n++] = i;
  }
  int handed = 0, committed = 0;
  SpiScope scope;
  spi_begin(&scope);
  for (int k = 0; k < nserved && !(isolating && handed > 0); k++) {
    if (k == nquiet && handed > 0 && !isolating) {
      spi_end(&scope);
      commit_and_send(st, handed);
      committed += handed;
      handed = 0;
      worker_xact_begin();
      pgstat_report_activity(STATE_RUNNING, "relaybus: dispatching");
      spi_begin(&scope);
    }
    int i = order[k];
    st->policy.took_turn(i);
    const HandlerEntry* h = catalog_handler_by_id(ids[i]);
    if (h == nullptr) continue;
    if (h->kind != core::HandlerKind::Notify) {
      handed += claim_callouts(st, h);
      continue;
    }
    int n = dispatch_notify(st, h);
    handed += n;
    note_notify_batch(st, h->id, n >= guc_batch_size);
    if (n >= guc_batch_size) *busy = true;
  }
  spi_end(&scope);
  return committed + handed;
}

// Housekeeping: dedupe rows past their window go now and then, a bounded
// batch at a time.
static void housekeeping(DispatcherState* st) {
  int64 now = now_ms();
  if (now - st->last_dedupe_cleanup_ms < guc_dedupe_cleanup_interval_ms) return;
  st->last_dedupe_cleanup_ms = now;
  dedupe_cleanup(kDedupeCleanupBatch);
}

// One iteration: lanes, claim and stage, housekeeping, commit, send; true if
// the next should follow at once.
static bool iterate(DispatcherState* st) {
  begin_iteration(st);
  balance_lanes(st);
  bool isolated = st->policy.isolating();
  bool busy = false;
  int handed = claim_and_stage(st, &busy);
  housekeeping(st);
  commit_and_send(st, handed);
  // A publisher that committed after our snapshot asked for a wake-up; if a
  // lock wait in this iteration reset the latch, set it again so that the
  // next wait returns at once instead of at the poll interval.
  if (pg_atomic_read_u32(&workers->slots[st->slot].wakes) != st->wakes_seen) SetLatch(MyLatch);

  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->slots[st->slot].delivered += handed;
  LWLockRelease(workers->lock);
  return st->policy.after_success(isolated, handed) || busy;
}

// Wait: for the latch, the pipeline's sockets, the end of a backoff, the next
// not-yet-ready delivery, the batching delay of results, or the poll interval.
static void wait_for_next(DispatcherState* st) {
  long timeout = static_cast<long>(guc_poll_interval_ms);
  int64 backoff_left = st->policy.retry_at_ms() - now_ms();
  if (backoff_left > 0) timeout = static_cast<long>(Max(1, Min(static_cast<int64>(timeout), backoff_left)));
  if (st->next_ready_ms > 0) {
    int64 until = st->next_ready_ms - now_ms() + 1;
    timeout = static_cast<long>(Max(1, Min(static_cast<int64>(timeout), until)));
  }
  if (http_collect() > 0) timeout = Min(timeout, static_cast<long>(kCompleteDelayMs));
  long spans = otlp_wait_ms();
  if (spans >= 0) timeout = Min(timeout, Max(1L, spans));
  st->run_iteration = wait_for_work(timeout) || st->run_iteration;
}

// Exit: requests in flight finish and are completed, unless DDL keeps the
// database out (DROP DATABASE ...) and needs us gone (a request may hang in
// its name lookup or on a slow receiver).
static void finish(DispatcherState* st, MemoryContext cxt) {
  MemoryContextSwitchTo(cxt);
  LWLockAcquire(workers->lock, LW_SHARED);
  bool kept_out = database_kept_out(st->dboid);
  LWLockRelease(workers->lock);
  if (!kept_out) drain_http_on_exit(cxt);
  http_shutdown();
  wait_set_close();
  proc_exit(0);
}

}  // namespace relaybus::pg

using namespace relaybus::pg;

extern "C" void relay_dispatcher_main(Datum) {
  DispatcherState* st = &state;
  MemoryContext cxt = start(st);
  for (;;) {
    CHECK_FOR_INTERRUPTS();                         // interrupts
    if (stopping(st) || !reload_settings()) break;  // reload (relaybus.enabled off: stop)
    MemoryContextSwitchTo(cxt);
    bool busy = false;
    ErrorData* error = worker_step(cxt, [&] {
      http_pump();  // send: queued requests go out as responses made room
      // A publisher's commit since the last iteration is claimed before the
      // results are settled, so a new event does not wait for that transaction.
      bool published = pg_atomic_read_u32(&workers->slots[st->slot].wakes) != st->wakes_seen;
      if (!published) collect_and_settle(st);  // collect, settle
      // After an environmental error, the iteration waits for its backoff.
      if (st->run_iteration && !stopping(st) && st->policy.may_run(now_ms())) {
        st->run_iteration = false;
        busy = iterate(st);  // lanes, claim and stage, housekeeping, send
      }
      if (published) collect_and_settle(st);
    });
    if (error != nullptr) after_error(st, cxt, error);  // errors: backoff or isolation
    otlp_pump();                                        // spans: export what is due
    MemoryContextReset(cxt);
    if (busy) {
      // The next iteration follows at once; the sockets and timers of the
      // requests in flight are served first, without waiting, or a handler
      // with full batches would hold every http request of this dispatcher.
      (void)wait_for_work(0);
      st->run_iteration = true;
    } else {
      wait_for_next(st);  // wait
    }
    MemoryContextReset(cxt);
  }
  finish(st, cxt);
}
