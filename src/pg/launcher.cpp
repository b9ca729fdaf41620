// The launcher: one background worker per server that keeps one set of
// dispatchers running for every database where relaybus is installed.
//
// It connects to no database (it reads the shared catalog pg_database only),
// starts dispatchers as dynamic background workers, and looks again when woken
// (CREATE EXTENSION, DROP DATABASE, a dispatcher's exit, a reload) or every
// 10 seconds. A dispatcher that finds no extension exits with 0 and its
// database is left alone until a CREATE EXTENSION relaybus commits there.

#include "pg/launcher.hpp"

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


void register_launcher() {
    BackgroundWorker w;
    memset(&w, 0, sizeof(w));
    w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    w.bgw_start_time = BgWorkerStart_RecoveryFinished;
    w.bgw_restart_time = 5;
    snprintf(w.bgw_library_name, BGW_MAXLEN, "relaybus");
    snprintf(w.bgw_function_name, BGW_MAXLEN, "relay_launcher_main");
    snprintf(w.bgw_name, BGW_MAXLEN, "relaybus launcher");
    snprintf(w.bgw_type, BGW_MAXLEN, "relaybus launcher");
    RegisterBackgroundWorker(&w);
}

struct ListedDatabase {
    Oid oid;
};

// Databases that accept connections and are not templates, filtered by relaybus.databases.
static int list_databases(ListedDatabase* out, int max) {
    List* wanted = NIL;
    if (guc_databases != nullptr && guc_databases[0] != '\0') {
        char* copy = pstrdup(guc_databases);
        if (!SplitIdentifierString(copy, ',', &wanted)) {
            ereport(WARNING, (errmsg("relaybus.databases is not a valid list of names: \"%s\"", guc_databases)));
            wanted = NIL;
        }
    }
    int n = 0;
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
        if (n < max) out[n++].oid = db->oid;
    }
    table_endscan(scan);
    table_close(rel, AccessShareLock);
    CommitTransactionCommand();
    MemoryContextSwitchTo(worker_loop_context());
    return n;
}

static BackgroundWorkerHandle* handles[kMaxDispatchers];

static bool start_dispatcher(int slot, Oid dboid) {
    BackgroundWorker w;
    memset(&w, 0, sizeof(w));
    w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    w.bgw_start_time = BgWorkerStart_RecoveryFinished;
    w.bgw_restart_time = 1;  // an error exit is restarted by the postmaster
    snprintf(w.bgw_library_name, BGW_MAXLEN, "relaybus");
    snprintf(w.bgw_function_name, BGW_MAXLEN, "relay_dispatcher_main");
    snprintf(w.bgw_name, BGW_MAXLEN, "relaybus dispatcher %u/%d", dboid, workers->slots[slot].worker_index);
    snprintf(w.bgw_type, BGW_MAXLEN, "relaybus dispatcher");
    w.bgw_main_arg = Int32GetDatum(slot);
    DispatcherArgs args = {slot, workers->epoch};
    memcpy(w.bgw_extra, &args, sizeof(args));
    w.bgw_notify_pid = MyProcPid;
    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
    bool ok = RegisterDynamicBackgroundWorker(&w, &handles[slot]);
    MemoryContextSwitchTo(old);
    if (!ok) {
        handles[slot] = nullptr;
        ereport(WARNING, (errmsg("relaybus could not start a dispatcher: no background worker slot free"),
                          errhint("Raise max_worker_processes.")));
    }
    return ok;
}

static void reconcile() {
    ListedDatabase dbs[kMaxDatabases];
    int ndb = guc_enabled ? list_databases(dbs, kMaxDatabases) : 0;

    // Forget dispatchers that stopped.
    for (int s = 0; s < kMaxDispatchers; s++) {
        if (handles[s] == nullptr) continue;
        pid_t pid;
        if (GetBackgroundWorkerPid(handles[s], &pid) == BGWH_STOPPED) {
            pfree(handles[s]);
            handles[s] = nullptr;
            LWLockAcquire(workers->lock, LW_EXCLUSIVE);
            workers->slots[s].dboid = InvalidOid;
            workers->slots[s].pid = 0;
            LWLockRelease(workers->lock);
        }
    }

    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    // Database states of databases that are gone (dropped, or no longer listed).
    for (int d = 0; d < kMaxDatabases; d++) {
        Oid oid = workers->databases[d].dboid;
        if (oid == InvalidOid || workers->databases[d].dropping) continue;
        bool listed = false;
        for (int i = 0; i < ndb; i++) listed |= dbs[i].oid == oid;
        if (!listed) workers->databases[d].dboid = InvalidOid;
    }
    // Stop dispatchers that should not run.
    for (int s = 0; s < kMaxDispatchers; s++) {
        DispatcherSlot& slot = workers->slots[s];
        if (slot.dboid == InvalidOid) continue;
        int d = database_slot(slot.dboid, false);
        bool keep = d >= 0 && !workers->databases[d].dropping && slot.worker_index < guc_workers_per_database;
        if (keep) continue;
        if (handles[s] != nullptr)
            TerminateBackgroundWorker(handles[s]);
        else if (slot.pid != 0)  // started by an earlier launcher
            kill(slot.pid, SIGTERM);
    }
    LWLockRelease(workers->lock);

    // Start the missing ones.
    for (int i = 0; i < ndb; i++) {
        LWLockAcquire(workers->lock, LW_EXCLUSIVE);
        int d = database_slot(dbs[i].oid, true);
        bool skip = d < 0 || workers->databases[d].no_extension || workers->databases[d].dropping;
        int to_start[kMaxWorkersPerDatabase];
        int nstart = 0;
        for (int w = 0; !skip && w < guc_workers_per_database; w++) {
            bool running = false;
            int free_slot = -1;
            for (int s = 0; s < kMaxDispatchers; s++) {
                DispatcherSlot& slot = workers->slots[s];
                if (slot.dboid == dbs[i].oid && slot.worker_index == w) running = true;
                if (free_slot < 0 && slot.dboid == InvalidOid && handles[s] == nullptr) free_slot = s;
            }
            if (running || free_slot < 0) continue;
            DispatcherSlot& slot = workers->slots[free_slot];
            memset(&slot, 0, sizeof(slot));
            pg_atomic_init_u32(&slot.wakes, 0);
            slot.dboid = dbs[i].oid;
            slot.worker_index = w;
            to_start[nstart++] = free_slot;
        }
        LWLockRelease(workers->lock);
        for (int k = 0; k < nstart; k++) {
            if (!start_dispatcher(to_start[k], dbs[i].oid)) {
                LWLockAcquire(workers->lock, LW_EXCLUSIVE);
                workers->slots[to_start[k]].dboid = InvalidOid;
                LWLockRelease(workers->lock);
            }
        }
    }
}

}  // namespace relaybus::pg

using namespace relaybus::pg;

extern "C" void relay_launcher_main(Datum) {
    install_worker_signals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    pgstat_report_appname("relaybus launcher");

    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    workers->launcher_pid = MyProcPid;
    workers->launcher_procno = MyProc->pgprocno;
    // Slots of a previous launcher (it crashed, the postmaster reset nothing) are stale.
    for (int s = 0; s < kMaxDispatchers; s++)
        if (workers->slots[s].pid == 0) workers->slots[s].dboid = InvalidOid;
    LWLockRelease(workers->lock);

    // Reset after every pass: the relaybus.databases list is parsed anew each time.
    MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "relaybus launcher", ALLOCSET_DEFAULT_SIZES);
    worker_xact_set_loop_context(cxt);
    while (!got_sigterm) {
        if (got_sighup) {
            got_sighup = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        MemoryContextSwitchTo(cxt);
        reconcile();
        MemoryContextReset(cxt);
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kLauncherNaptimeMs,
                        PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
    }
    workers->launcher_pid = 0;
    proc_exit(0);
}
