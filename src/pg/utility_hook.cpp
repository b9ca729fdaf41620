// Keeps the workers in step with DDL that concerns them, from any backend, and
// acts only on what takes effect:
//
// - Installing or dropping relaybus (CREATE EXTENSION, DROP EXTENSION, and the
//   DROP SCHEMA / DROP OWNED / DROP ... CASCADE paths that drop it): seen by an
//   object-access hook on the extension object itself, so a CREATE EXTENSION IF
//   NOT EXISTS that finds relaybus installed (a no-op) does nothing. When such
//   a transaction commits, the database's leases are purged (delivery ids
//   start again in a new extension) and the launcher looks again.
// - Statements that fail while another session is connected to a database
//   (DROP DATABASE [WITH (FORCE)], ALTER DATABASE ... RENAME TO / SET
//   TABLESPACE, CREATE DATABASE ... TEMPLATE): the database's dispatchers are
//   asked to leave and kept out while the statement runs, so relaybus never
//   makes them fail with "being accessed by other users". This happens only
//   after the checks PostgreSQL makes before it looks for other sessions
//   (transaction block, read-only transaction, ownership and privileges,
//   the current database) have passed: a statement that fails on those leaves
//   the dispatchers alone.

#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"
#include "pg/claim_frontier.hpp"
#include "pg/leases.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "access/genam.h"
#include "access/table.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_tablespace.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "commands/tablespace.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
}

namespace relaybus::pg {

static ProcessUtility_hook_type prev_process_utility = nullptr;
static object_access_hook_type prev_object_access = nullptr;

// Lowest transaction nesting level at which relaybus was installed or dropped
// in this transaction (0: not at all).
static int extension_changed_level = 0;

// ---------------------------------------------------------------- install and drop

// Whether an extension row is relaybus's. SnapshotSelf: at OAT_POST_CREATE the
// row was inserted by the running command, invisible to an MVCC snapshot.
static bool is_relaybus_extension(Oid ext) {
  Relation rel = table_open(ExtensionRelationId, AccessShareLock);
  ScanKeyData key;
  ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(ext));
  SysScanDesc scan = systable_beginscan(rel, ExtensionOidIndexId, true, SnapshotSelf, 1, &key);
  HeapTuple tup = systable_getnext(scan);
  bool ours = HeapTupleIsValid(tup) &&
              strcmp(NameStr(reinterpret_cast<Form_pg_extension>(GETSTRUCT(tup))->extname), "relaybus") == 0;
  systable_endscan(scan);
  table_close(rel, AccessShareLock);
  return ours;
}

static void relay_object_access(ObjectAccessType access, Oid class_id, Oid object_id, int sub_id, void* arg) {
  if (prev_object_access != nullptr) prev_object_access(access, class_id, object_id, sub_id, arg);
  if (class_id != ExtensionRelationId || (access != OAT_POST_CREATE && access != OAT_DROP)) return;
  if (!is_relaybus_extension(object_id)) return;
  int level = GetCurrentTransactionNestLevel();
  if (extension_changed_level == 0 || level < extension_changed_level) extension_changed_level = level;
}

// A COPY into relay.deliveries ran in this transaction (pg_restore loads the
// outbox that way): the pending counts cannot follow it row by row.
static bool deliveries_copied = false;

static bool is_copy_into_deliveries(Node* stmt) {
  if (!IsA(stmt, CopyStmt)) return false;
  auto* copy = reinterpret_cast<CopyStmt*>(stmt);
  if (!copy->is_from || copy->relation == nullptr || strcmp(copy->relation->relname, "deliveries") != 0) return false;
  Oid nsp = get_namespace_oid("relay", true);
  Oid deliveries = OidIsValid(nsp) ? get_relname_relid("deliveries", nsp) : InvalidOid;
  return OidIsValid(deliveries) && RangeVarGetRelid(copy->relation, NoLock, true) == deliveries;
}

void utility_at_xact_end(bool commit) {
  if (deliveries_copied && commit) {
    forget_pending_counts(MyDatabaseId);
    frontier_forget(0);  // rows with any id arrived
    rescan_dispatchers(MyDatabaseId);
  }
  deliveries_copied = false;
  if (extension_changed_level > 0 && commit && workers != nullptr) {
    LWLockAcquire(workers->lock, LW_EXCLUSIVE);
    workers->extension_generation++;
    LWLockRelease(workers->lock);
    // Delivery ids start again in a new extension: leases of the old one must not block them.
    leases_purge_database(MyDatabaseId);
    frontier_forget(0);
    rescan_dispatchers(MyDatabaseId);
    wake_launcher();
  }
  extension_changed_level = 0;
}

void utility_at_subxact_end(bool commit, int nest_level) {
  if (extension_changed_level < nest_level) return;
  extension_changed_level = commit ? nest_level - 1 : 0;
}

// ---------------------------------------------------------------- DDL on a database

static bool owns_database(Oid dboid) { return relaybus_owns_database(dboid); }

static bool can_create_in_tablespace(Oid tablespace) { return relaybus_may_create_in_tablespace(tablespace); }

// As dbcommands.c's have_createdb_privilege (static there).
static bool can_create_databases() {
  if (superuser()) return true;
  HeapTuple tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
  if (!HeapTupleIsValid(tup)) return false;
  bool ok = reinterpret_cast<Form_pg_authid>(GETSTRUCT(tup))->rolcreatedb;
  ReleaseSysCache(tup);
  return ok;
}

struct DatabaseFacts {
  bool is_template;
  Oid tablespace;
};

static bool database_facts(Oid dboid, DatabaseFacts* out) {
  HeapTuple tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
  if (!HeapTupleIsValid(tup)) return false;
  auto* db = reinterpret_cast<Form_pg_database>(GETSTRUCT(tup));
  out->is_template = db->datistemplate;
  out->tablespace = db->dattablespace;
  ReleaseSysCache(tup);
  return true;
}

// DROP EXTENSION relaybus, or DROP SCHEMA relay CASCADE, by a role that may:
// the database's own dispatchers step aside first. They lock relay's tables
// in another order than the drop does, and a drop racing an iteration
// deadlocked (one of the two was cancelled).
static bool drops_relaybus(DropStmt* s) {
  const char* name = s->removeType == OBJECT_EXTENSION                                 ? "relaybus"
                     : (s->removeType == OBJECT_SCHEMA && s->behavior == DROP_CASCADE) ? "relay"
                                                                                       : nullptr;
  if (name == nullptr) return false;
  ListCell* lc;
  foreach (lc, s->objects) {
    Node* o = static_cast<Node*>(lfirst(lc));
    if (IsA(o, String) && strcmp(strVal(o), name) == 0) {
      Oid ext = get_extension_oid("relaybus", true);
      if (!OidIsValid(ext)) return false;
      return relaybus_owns_extension(ext);
    }
  }
  return false;
}

static DefElem* find_option(List* options, const char* name) {
  ListCell* lc;
  foreach (lc, options) {
    auto* d = static_cast<DefElem*>(lfirst(lc));
    if (strcmp(d->defname, name) == 0) return d;
  }
  return nullptr;
}

// The database whose dispatchers must leave for this statement to succeed, or
// InvalidOid: not such a statement, or one that PostgreSQL's own checks will
// refuse (those that run before it looks for other sessions; they raise the
// same error here as there, or are left to PostgreSQL).
static Oid database_to_clear(Node* stmt, bool top_level) {
  switch (nodeTag(stmt)) {
    case T_DropdbStmt: {
      auto* s = reinterpret_cast<DropdbStmt*>(stmt);
      PreventCommandIfReadOnly("DROP DATABASE");
      PreventInTransactionBlock(top_level, "DROP DATABASE");
      Oid dboid = get_database_oid(s->dbname, true);
      DatabaseFacts f;
      if (!OidIsValid(dboid) || dboid == MyDatabaseId || !owns_database(dboid) || !database_facts(dboid, &f) ||
          f.is_template)
        return InvalidOid;
      return dboid;
    }
    case T_RenameStmt: {
      auto* s = reinterpret_cast<RenameStmt*>(stmt);
      if (s->renameType != OBJECT_DATABASE) return InvalidOid;
      PreventCommandIfReadOnly("ALTER DATABASE");
      Oid dboid = get_database_oid(s->subname, true);
      if (!OidIsValid(dboid) || dboid == MyDatabaseId || !owns_database(dboid) || !can_create_databases() ||
          OidIsValid(get_database_oid(s->newname, true)))
        return InvalidOid;
      return dboid;
    }
    case T_AlterDatabaseStmt: {
      auto* s = reinterpret_cast<AlterDatabaseStmt*>(stmt);
      DefElem* ts = find_option(s->options, "tablespace");
      if (ts == nullptr) return InvalidOid;
      PreventCommandIfReadOnly("ALTER DATABASE");
      PreventInTransactionBlock(top_level, "ALTER DATABASE SET TABLESPACE");
      Oid dboid = get_database_oid(s->dbname, true);
      Oid tablespace = get_tablespace_oid(defGetString(ts), true);
      DatabaseFacts f;
      if (!OidIsValid(dboid) || dboid == MyDatabaseId || !owns_database(dboid) || !OidIsValid(tablespace) ||
          !can_create_in_tablespace(tablespace) || !database_facts(dboid, &f) || f.tablespace == tablespace)
        return InvalidOid;
      return dboid;
    }
    case T_CreatedbStmt: {
      auto* s = reinterpret_cast<CreatedbStmt*>(stmt);
      DefElem* tmpl = find_option(s->options, "template");
      if (tmpl == nullptr || tmpl->arg == nullptr) return InvalidOid;  // template1: never served
      PreventCommandIfReadOnly("CREATE DATABASE");
      PreventInTransactionBlock(top_level, "CREATE DATABASE");
      Oid dboid = get_database_oid(defGetString(tmpl), true);
      DatabaseFacts f;
      if (!OidIsValid(dboid) || !can_create_databases() || OidIsValid(get_database_oid(s->dbname, true)) ||
          !database_facts(dboid, &f) || (!f.is_template && !owns_database(dboid)))
        return InvalidOid;
      return dboid;
    }
    case T_DropStmt:
      return drops_relaybus(reinterpret_cast<DropStmt*>(stmt)) ? MyDatabaseId : InvalidOid;
    default:
      return InvalidOid;
  }
}

// Marks the database kept out (the launcher starts no dispatcher there, one
// starting now leaves at once) and signals its running dispatchers, whose
// pids it writes to pids (nslots entries, 0 where none); returns their number.
static int keep_out_begin(Oid dboid, int* pids) {
  int n = 0;
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  int d = database_slot(dboid, true);
  if (d >= 0) workers->databases[d].keep_out++;
  for (int s = 0; s < workers->nslots; s++)
    if (workers->slots[s].dboid == dboid && workers->slots[s].pid != 0) {
      pids[n++] = workers->slots[s].pid;
      kill(workers->slots[s].pid, SIGTERM);
    }
  LWLockRelease(workers->lock);
  return n;
}

static void keep_out_end(Oid dboid) {
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  int d = database_slot(dboid, false);
  if (d >= 0 && workers->databases[d].keep_out > 0) workers->databases[d].keep_out--;
  LWLockRelease(workers->lock);
  wake_launcher();
}

// Waits (a few seconds at most, interruptibly) until the database's
// dispatchers have exited: PostgreSQL would otherwise count them as other
// sessions (and DROP DATABASE ... WITH (FORCE) by a non-superuser owner would
// refuse to terminate them: they have no role). A dispatcher frees its slot
// before it leaves the process array, so both are waited for. SIGTERM ends a
// dispatcher at once, even in a lock wait, so this is short; if one is stuck,
// PostgreSQL's own wait decides.
static bool dispatchers_running(Oid dboid, const int* pids, int npids) {
  bool running = false;
  LWLockAcquire(workers->lock, LW_SHARED);
  for (int s = 0; s < workers->nslots && !running; s++)
    running = workers->slots[s].dboid == dboid && workers->slots[s].pid != 0;
  LWLockRelease(workers->lock);
  for (int i = 0; i < npids && !running; i++) running = BackendPidGetProc(pids[i]) != nullptr;
  return running;
}

static void wait_dispatchers_gone(Oid dboid, const int* pids, int npids) {
  constexpr int kMaxWaitMs = 5000;
  constexpr int kStepMs = 10;
  for (int waited = 0; waited < kMaxWaitMs && dispatchers_running(dboid, pids, npids); waited += kStepMs) {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kStepMs, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
  }
}

static void call_next(PlannedStmt* pstmt, const char* query, bool read_only_tree, ProcessUtilityContext context,
                      ParamListInfo params, QueryEnvironment* env, DestReceiver* dest, QueryCompletion* qc) {
  if (prev_process_utility != nullptr)
    prev_process_utility(pstmt, query, read_only_tree, context, params, env, dest, qc);
  else
    standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc);
}

static void relay_process_utility(PlannedStmt* pstmt, const char* query, bool read_only_tree,
                                  ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* env,
                                  DestReceiver* dest, QueryCompletion* qc) {
  Node* stmt = pstmt->utilityStmt;
  if (is_copy_into_deliveries(stmt)) deliveries_copied = true;
  Oid dboid = workers != nullptr ? database_to_clear(stmt, context == PROCESS_UTILITY_TOPLEVEL) : InvalidOid;
  if (!OidIsValid(dboid)) {
    call_next(pstmt, query, read_only_tree, context, params, env, dest, qc);
    return;
  }
  int* pids = static_cast<int*>(palloc0(sizeof(int) * workers->nslots));
  int npids = keep_out_begin(dboid, pids);
  PG_TRY();
  {
    wait_dispatchers_gone(dboid, pids, npids);
    call_next(pstmt, query, read_only_tree, context, params, env, dest, qc);
  }
  PG_FINALLY();
  { keep_out_end(dboid); }
  PG_END_TRY();
}

void install_utility_hook() {
  prev_process_utility = ProcessUtility_hook;
  ProcessUtility_hook = relay_process_utility;
  prev_object_access = object_access_hook;
  object_access_hook = relay_object_access;
}

}  // namespace relaybus::pg
