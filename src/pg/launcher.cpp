// The launcher: one background worker per server that keeps one set of
// dispatchers running for every database where relaybus is installed.
//
// It connects to no database (it reads the shared catalog pg_database only),
// starts dispatchers as dynamic background workers, and looks again when woken
// (CREATE or DROP EXTENSION, DDL on a database, a dispatcher's exit, a reload)
// or every 10 seconds. A dispatcher that finds no extension says so in its slot
// and exits; its database is left alone until a CREATE EXTENSION relaybus
// commits somewhere (the extension generation changes).
//
// Restarts: dispatchers are never restarted by the postmaster
// (BGW_NEVER_RESTART); the launcher starts a stopped one again, whatever
// stopped it (pg_terminate_backend, an error), at most once a second per
// database, unless its database is gone, has no relaybus, is kept out by DDL or
// relaybus.enabled is off. The launcher itself exits with FATAL (code 1) on
// SIGTERM (die), so the postmaster starts it again after bgw_restart_time; a new
// launcher adopts the dispatchers that are still running.
//
// pg_upgrade: no launcher in binary upgrade mode (register_launcher).
//
// Standbys: the launcher starts when recovery finishes
// (BgWorkerStart_RecoveryFinished), so the postmaster runs no relaybus process
// on a hot standby and starts the launcher right after a promotion: no polling
// of RecoveryInProgress() is needed (test/integration/failover.sh).
//
// How many databases: as many as have relaybus. The launcher's own memory
// holds what it knows per database; shared memory holds one slot per
// background worker process. When no worker slot is free for a database, it
// logs that once (naming the database) and relay.workers of that database
// shows a row without a pid saying so.

#include "pg/launcher.hpp"

#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"
#include "pg/settings.hpp"
#include "pg/worker_signals.hpp"
#include "pg/worker_state.hpp"
#include "pg/worker_xact.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "postmaster/interrupt.h"
#include "utils/hsearch.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/varlena.h"

PGDLLEXPORT void relay_launcher_main(Datum arg);
}

namespace relaybus::pg {

constexpr long kLauncherNaptimeMs = 10000;
constexpr long kStopGraceMs = 10000;    // a dispatcher asked to stop, before SIGTERM
constexpr long kRestartDelayMs = 1000;  // a dispatcher that keeps failing restarts once a second

void register_launcher() {
  // Not in binary upgrade mode (postgres -b, how pg_upgrade starts both
  // clusters; the postmaster has parsed its options before it loads
  // shared_preload_libraries): a dispatcher there would deliver, and delete,
  // deliveries of the old cluster while pg_upgrade reads it, or of the new
  // one while its files are put in place. PostgreSQL keeps its own logical
  // replication launcher out the same way. test/upgrade/pg_upgrade.sh.
  if (IsBinaryUpgrade) return;
  BackgroundWorker w;
  memset(&w, 0, sizeof(w));
  w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  w.bgw_start_time = BgWorkerStart_RecoveryFinished;
  w.bgw_restart_time = 1;  // after pg_terminate_backend or an error (exit code 1)
  snprintf(w.bgw_library_name, BGW_MAXLEN, "relaybus");
  snprintf(w.bgw_function_name, BGW_MAXLEN, "relay_launcher_main");
  snprintf(w.bgw_name, BGW_MAXLEN, "relaybus launcher");
  snprintf(w.bgw_type, BGW_MAXLEN, "relaybus launcher");
  RegisterBackgroundWorker(&w);
}

struct ListedDatabase {
  Oid oid;
  NameData name;
};

// What the launcher knows of a database (its own memory, any number of them).
struct KnownDatabase {
  Oid dboid;          // hash key
  bool no_extension;  // a dispatcher found no relaybus at generation no_extension_at
  uint64 no_extension_at;
  bool reported_no_slot;  // "could not start a dispatcher" was logged
  TimestampTz last_start;
};

static HTAB* known = nullptr;

static KnownDatabase* known_database(Oid dboid) {
  if (known == nullptr) {
    HASHCTL ctl;
    memset(&ctl, 0, sizeof(ctl));
    ctl.keysize = sizeof(Oid);
    ctl.entrysize = sizeof(KnownDatabase);
    ctl.hcxt = TopMemoryContext;
    known = hash_create("relaybus launcher databases", 256, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
  }
  bool found = false;
  auto* k = static_cast<KnownDatabase*>(hash_search(known, &dboid, HASH_ENTER, &found));
  if (!found) {
    memset(k, 0, sizeof(*k));
    k->dboid = dboid;
  }
  return k;
}

// Databases that accept connections and are not templates, filtered by relaybus.databases.
static List* list_databases() {
  List* wanted = NIL;
  if (guc_databases != nullptr && guc_databases[0] != '\0') {
    char* copy = pstrdup(guc_databases);
    if (!SplitIdentifierString(copy, ',', &wanted)) {
      ereport(WARNING, (errmsg("relaybus.databases is not a valid list of names: \"%s\"", guc_databases)));
      wanted = NIL;
    }
  }
  List* out = NIL;
  StartTransactionCommand();
  Relation rel = table_open(DatabaseRelationId, AccessShareLock);
  TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
  HeapTuple tup;
  while ((tup = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
    auto* db = reinterpret_cast<Form_pg_database>(GETSTRUCT(tup));
    if (db->datistemplate || !db->datallowconn || db->datconnlimit == -2) continue;
    if (wanted != NIL) {
      bool keep = false;
      ListCell* lc;
      foreach (lc, wanted)
        if (strcmp(static_cast<char*>(lfirst(lc)), NameStr(db->datname)) == 0) keep = true;
      if (!keep) continue;
    }
    auto* l = static_cast<ListedDatabase*>(MemoryContextAlloc(TopMemoryContext, sizeof(ListedDatabase)));
    l->oid = db->oid;
    l->name = db->datname;
    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
    out = lappend(out, l);
    MemoryContextSwitchTo(old);
  }
  table_endscan(scan);
  table_close(rel, AccessShareLock);
  CommitTransactionCommand();
  MemoryContextSwitchTo(worker_loop_context());
  return out;
}

static BackgroundWorkerHandle** handles = nullptr;  // [workers->nslots]

static bool start_dispatcher(int slot, Oid dboid, uint32 ticket) {
  BackgroundWorker w;
  memset(&w, 0, sizeof(w));
  w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  w.bgw_start_time = BgWorkerStart_RecoveryFinished;
  w.bgw_restart_time = BGW_NEVER_RESTART;  // the launcher restarts it (see the file comment)
  snprintf(w.bgw_library_name, BGW_MAXLEN, "relaybus");
  snprintf(w.bgw_function_name, BGW_MAXLEN, "relay_dispatcher_main");
  snprintf(w.bgw_name, BGW_MAXLEN, "relaybus dispatcher %u/%d", dboid, workers->slots[slot].worker_index);
  snprintf(w.bgw_type, BGW_MAXLEN, "relaybus dispatcher");
  w.bgw_main_arg = Int32GetDatum(slot);
  DispatcherArgs args = {slot, workers->epoch, ticket};
  memcpy(w.bgw_extra, &args, sizeof(args));
  w.bgw_notify_pid = MyProcPid;
  MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
  bool ok = RegisterDynamicBackgroundWorker(&w, &handles[slot]);
  MemoryContextSwitchTo(old);
  if (!ok) handles[slot] = nullptr;
  return ok;
}

// Frees the slots of dispatchers that stopped, noting which found no relaybus.
static void reap_stopped() {
  for (int s = 0; s < workers->nslots; s++) {
    bool stopped;
    if (handles[s] != nullptr) {
      pid_t pid;
      stopped = GetBackgroundWorkerPid(handles[s], &pid) == BGWH_STOPPED;
    } else {
      // Started by an earlier launcher: stopped once its pid is gone.
      LWLockAcquire(workers->lock, LW_SHARED);
      stopped = workers->slots[s].dboid != InvalidOid && workers->slots[s].pid == 0;
      LWLockRelease(workers->lock);
    }
    if (!stopped) continue;
    if (handles[s] != nullptr) {
      pfree(handles[s]);
      handles[s] = nullptr;
    }
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    DispatcherSlot& slot = workers->slots[s];
    Oid dboid = slot.dboid;
    bool no_extension = slot.found_no_extension;
    uint64 seen = slot.generation_seen;
    if (slot.pid == 0) {  // else a late start of a slot we gave away; it leaves by itself
      slot.dboid = InvalidOid;
      slot.ticket++;
    }
    LWLockRelease(workers->lock);
    if (no_extension && OidIsValid(dboid)) {
      KnownDatabase* k = known_database(dboid);
      k->no_extension = true;
      k->no_extension_at = seen;
    }
  }
}

static bool is_listed(List* dbs, Oid oid) {
  ListCell* lc;
  foreach (lc, dbs)
    if (static_cast<ListedDatabase*>(lfirst(lc))->oid == oid) return true;
  return false;
}

// Logs once per database that no background worker slot was free for it, and
// shows it in relay.workers of that database.
static void report_not_started(const ListedDatabase* db) {
  KnownDatabase* k = known_database(db->oid);
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  int d = database_slot_for_report(db->oid);
  if (d >= 0 && workers->databases[d].not_started_since == 0)
    workers->databases[d].not_started_since = GetCurrentTimestamp();
  LWLockRelease(workers->lock);
  if (k->reported_no_slot) return;
  k->reported_no_slot = true;
  ereport(WARNING, (errmsg("relaybus could not start a dispatcher for database \"%s\": no background worker slot free",
                           NameStr(db->name)),
                    errhint("Raise max_worker_processes (relaybus needs one per database it serves, "
                            "times relaybus.workers_per_database, plus the launcher).")));
}

static void report_started(Oid dboid) {
  KnownDatabase* k = known_database(dboid);
  k->reported_no_slot = false;
  k->last_start = GetCurrentTimestamp();
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  int d = database_slot(dboid, false);
  if (d >= 0) workers->databases[d].not_started_since = 0;
  LWLockRelease(workers->lock);
}

// Returns how long until a delayed restart is due (ms), or -1.
static long reconcile() {
  List* dbs = guc_enabled ? list_databases() : NIL;
  reap_stopped();
  long retry_ms = -1;
  TimestampTz now = GetCurrentTimestamp();
  uint64 generation;
  // The dispatchers asked to stop now, logged once the lock is released.
  struct AskedToStop {
    int pid, worker_index;
    Oid dboid;
    bool listed;
  };
  auto* asked = static_cast<AskedToStop*>(palloc(sizeof(AskedToStop) * Max(workers->nslots, 1)));
  int nasked = 0;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  generation = workers->extension_generation;
  // Stop dispatchers that should not run.
  for (int s = 0; s < workers->nslots; s++) {
    DispatcherSlot& slot = workers->slots[s];
    if (slot.dboid == InvalidOid) continue;
    int d = database_slot(slot.dboid, false);
    bool kept_out = d >= 0 && workers->databases[d].keep_out > 0;
    bool keep = !kept_out && is_listed(dbs, slot.dboid) && slot.worker_index < guc_workers_per_database;
    if (keep) {
      slot.stop_requested_at = 0;
      continue;
    }
    // DDL waits for a kept-out database's dispatchers: SIGTERM at once.
    // Otherwise ask, so that the dispatcher ends its transaction and its
    // requests in flight and exits 0; SIGTERM only if it has not after a grace.
    if (!kept_out && slot.pid != 0) {
      if (slot.stop_requested_at == 0) {
        slot.stop_requested_at = now;
        wake_dispatcher(slot);
        asked[nasked++] = {slot.pid, slot.worker_index, slot.dboid, is_listed(dbs, slot.dboid)};
      }
      TimestampTz force_at = TimestampTzPlusMilliseconds(slot.stop_requested_at, kStopGraceMs);
      if (now < force_at) {
        long wait = static_cast<long>((force_at - now) / 1000) + 1;
        retry_ms = retry_ms < 0 ? wait : Min(retry_ms, wait);
        continue;
      }
    }
    if (handles[s] != nullptr)
      TerminateBackgroundWorker(handles[s]);
    else if (slot.pid != 0)  // started by an earlier launcher
      kill(slot.pid, SIGTERM);
  }
  // Database states nobody needs any more.
  for (int d = 0; d < workers->ndatabases; d++) {
    DatabaseState& db = workers->databases[d];
    if (db.dboid == InvalidOid || db.keep_out > 0) continue;
    bool used = false;
    for (int s = 0; s < workers->nslots && !used; s++) used = workers->slots[s].dboid == db.dboid;
    if (!used && (db.not_started_since == 0 || !is_listed(dbs, db.dboid))) db.dboid = InvalidOid;
  }
  LWLockRelease(workers->lock);
  for (int i = 0; i < nasked; i++) {
    const AskedToStop& a = asked[i];
    const char* why = a.listed ? psprintf("relaybus.workers_per_database is %d.", guc_workers_per_database)
                               : "relaybus no longer serves the database: relaybus.enabled is off, relaybus.databases "
                                 "leaves it out, or it was dropped, made a template or closed to connections.";
    ereport(LOG, (errmsg("relaybus launcher: asking dispatcher %d (worker %d of database %u) to stop", a.pid,
                         a.worker_index, a.dboid),
                  errdetail("%s", why)));
  }
  pfree(asked);

  // Start the missing ones.
  ListCell* lc;
  foreach (lc, dbs) {
    auto* db = static_cast<ListedDatabase*>(lfirst(lc));
    KnownDatabase* k = known_database(db->oid);
    if (k->no_extension && k->no_extension_at == generation) continue;
    k->no_extension = false;
    int to_start[kMaxWorkersPerDatabase];
    uint32 tickets[kMaxWorkersPerDatabase];
    int nstart = 0;
    bool no_slot = false;
    bool delayed = k->last_start != 0 && now < TimestampTzPlusMilliseconds(k->last_start, kRestartDelayMs);
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    bool skip = database_kept_out(db->oid);
    for (int w = 0; !skip && w < guc_workers_per_database; w++) {
      bool running = false;
      int free_slot = -1;
      for (int s = 0; s < workers->nslots; s++) {
        DispatcherSlot& slot = workers->slots[s];
        if (slot.dboid == db->oid && slot.worker_index == w) running = true;
        if (free_slot < 0 && slot.dboid == InvalidOid && handles[s] == nullptr) free_slot = s;
      }
      if (running) continue;
      if (delayed) {
        long wait = static_cast<long>((TimestampTzPlusMilliseconds(k->last_start, kRestartDelayMs) - now) / 1000) + 1;
        retry_ms = retry_ms < 0 ? wait : Min(retry_ms, wait);
        continue;
      }
      if (free_slot < 0 || database_slot(db->oid, true) < 0) {
        no_slot = true;
        continue;
      }
      DispatcherSlot& slot = workers->slots[free_slot];
      uint32 ticket = slot.ticket + 1;
      memset(&slot, 0, sizeof(slot));
      pg_atomic_init_u32(&slot.wakes, 0);
      pg_atomic_init_u32(&slot.rescans, 0);
      slot.dboid = db->oid;
      slot.worker_index = w;
      slot.ticket = ticket;
      tickets[nstart] = ticket;
      to_start[nstart++] = free_slot;
    }
    LWLockRelease(workers->lock);
    for (int i = 0; i < nstart; i++) {
      if (start_dispatcher(to_start[i], db->oid, tickets[i])) continue;
      no_slot = true;
      LWLockAcquire(workers->lock, LW_EXCLUSIVE);
      workers->slots[to_start[i]].dboid = InvalidOid;
      LWLockRelease(workers->lock);
    }
    if (no_slot)
      report_not_started(db);
    else if (nstart > 0)
      report_started(db->oid);
  }
  list_free_deep(dbs);
  return retry_ms;
}

static void on_launcher_exit(int, Datum) {
  if (workers == nullptr) return;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  if (workers->launcher_pid == MyProcPid) workers->launcher_pid = 0;
  LWLockRelease(workers->lock);
}

}  // namespace relaybus::pg

using namespace relaybus::pg;

extern "C" void relay_launcher_main(Datum) {
  install_launcher_signals();
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  pgstat_report_appname("relaybus launcher");

  handles = static_cast<BackgroundWorkerHandle**>(
      MemoryContextAllocZero(TopMemoryContext, sizeof(BackgroundWorkerHandle*) * workers->nslots));
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->launcher_pid = MyProcPid;
  workers->launcher_procno = relaybus_procno();
  LWLockRelease(workers->lock);
  before_shmem_exit(on_launcher_exit, 0);

  // Reset after every pass: the relaybus.databases list is parsed anew each time.
  MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "relaybus launcher", ALLOCSET_DEFAULT_SIZES);
  worker_xact_set_loop_context(cxt);
  for (;;) {
    CHECK_FOR_INTERRUPTS();  // SIGTERM: FATAL, exit code 1, restarted by the postmaster
    if (ConfigReloadPending) {
      ConfigReloadPending = false;
      ProcessConfigFile(PGC_SIGHUP);
    }
    MemoryContextSwitchTo(cxt);
    long retry_ms = reconcile();
    MemoryContextReset(cxt);
    long wait_ms = retry_ms >= 0 ? Min(retry_ms, kLauncherNaptimeMs) : kLauncherNaptimeMs;
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, wait_ms, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  }
}
