// Keeps the workers in step with DDL that concerns them, from any backend:
// CREATE EXTENSION relaybus wakes the launcher when it commits, and
// DROP DATABASE asks that database's dispatchers to leave first, so that
// relaybus never makes DROP DATABASE fail with "being accessed by other users".

#include "pg/pg_includes.hpp"
#include "pg/leases.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "commands/dbcommands.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
}

namespace relaybus::pg {

static ProcessUtility_hook_type prev_process_utility = nullptr;
static bool launcher_wake_at_commit = false;

static void call_next(PlannedStmt* pstmt, const char* query, bool read_only_tree, ProcessUtilityContext context,
                      ParamListInfo params, QueryEnvironment* env, DestReceiver* dest, QueryCompletion* qc) {
    if (prev_process_utility != nullptr)
        prev_process_utility(pstmt, query, read_only_tree, context, params, env, dest, qc);
    else
        standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc);
}

static int set_dropping(Oid dboid, bool dropping) {
    int signalled = 0;
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    int d = database_slot(dboid, dropping);
    if (d >= 0) workers->databases[d].dropping = dropping;
    if (dropping)
        for (int s = 0; s < kMaxDispatchers; s++)
            if (workers->slots[s].dboid == dboid && workers->slots[s].pid != 0) {
                kill(workers->slots[s].pid, SIGTERM);
                signalled++;
            }
    LWLockRelease(workers->lock);
    return signalled;
}

static void relay_process_utility(PlannedStmt* pstmt, const char* query, bool read_only_tree,
                                  ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* env,
                                  DestReceiver* dest, QueryCompletion* qc) {
    Node* stmt = pstmt->utilityStmt;
    if (workers != nullptr && IsA(stmt, DropdbStmt)) {
        Oid dboid = get_database_oid(reinterpret_cast<DropdbStmt*>(stmt)->dbname, true);
        if (OidIsValid(dboid)) {
            set_dropping(dboid, true);
            // DROP DATABASE waits up to 5 s for other sessions to leave; ours leave at once.
            PG_TRY();
            {
                call_next(pstmt, query, read_only_tree, context, params, env, dest, qc);
            }
            PG_FINALLY();
            {
                set_dropping(dboid, false);
                wake_launcher();
            }
            PG_END_TRY();
            return;
        }
    }
    if (IsA(stmt, CreateExtensionStmt) &&
        strcmp(reinterpret_cast<CreateExtensionStmt*>(stmt)->extname, "relaybus") == 0)
        launcher_wake_at_commit = true;
    call_next(pstmt, query, read_only_tree, context, params, env, dest, qc);
}

void install_utility_hook() {
    prev_process_utility = ProcessUtility_hook;
    ProcessUtility_hook = relay_process_utility;
}

void utility_at_xact_end(bool commit) {
    if (launcher_wake_at_commit && commit && workers != nullptr) {
        LWLockAcquire(workers->lock, LW_EXCLUSIVE);
        int d = database_slot(MyDatabaseId, true);
        if (d >= 0) {
            workers->databases[d].no_extension = false;
            workers->databases[d].created++;
        }
        LWLockRelease(workers->lock);
        // Delivery ids start again in a new extension: leases of the old one must not block them.
        leases_purge_database(MyDatabaseId);
        wake_launcher();
    }
    launcher_wake_at_commit = false;
}

}  // namespace relaybus::pg
