// Every difference between the PostgreSQL majors relaybus builds against
// (15, 16, 17, 18 and 19), in one place, behind PG_VERSION_NUM: small inline
// wrappers named for what they do, with the same behaviour on every major.
// The logic files call these and test no version themselves.
#pragma once

#include "pg/pg_includes.hpp"

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 200000
#error "relaybus supports PostgreSQL 15, 16, 17, 18 and 19 only"
#endif

extern "C" {
#include "access/genam.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_tablespace.h"
#include "executor/executor.h"
#include "nodes/pathnodes.h"
#if PG_VERSION_NUM >= 190000
#include "optimizer/pathnode.h"
#else
#include "optimizer/plancat.h"
#endif
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/resowner.h"
#if PG_VERSION_NUM >= 180000
#include "storage/waiteventset.h"
#endif
}

// ------------------------------------------------------------- processes

// This backend's index in ProcGlobal->allProcs (what a latch is set through).
// 17 dropped PGPROC.pgprocno for MyProcNumber.
static inline int relaybus_procno() {
#if PG_VERSION_NUM >= 170000
  return MyProcNumber;
#else
  return MyProc->pgprocno;
#endif
}

// Installs fn to be called with each base relation of a plan being made, once
// its indexes are listed (rel->indexlist), after the hooks installed before:
// get_relation_info_hook up to 18; 19 replaced it with build_simple_rel_hook,
// called at the end of build_simple_rel with the range table entry.
using RelaybusRelationInfoFn = void (*)(Oid relid, RelOptInfo* rel);
#if PG_VERSION_NUM >= 190000
static inline void relaybus_install_relation_info_hook(RelaybusRelationInfoFn fn) {
  static RelaybusRelationInfoFn target = nullptr;
  static build_simple_rel_hook_type prev = nullptr;
  target = fn;
  prev = build_simple_rel_hook;
  build_simple_rel_hook = [](PlannerInfo* root, RelOptInfo* rel, RangeTblEntry* rte) {
    if (prev != nullptr) prev(root, rel, rte);
    if (rte->rtekind == RTE_RELATION) target(rte->relid, rel);
  };
}
#else
static inline void relaybus_install_relation_info_hook(RelaybusRelationInfoFn fn) {
  static RelaybusRelationInfoFn target = nullptr;
  static get_relation_info_hook_type prev = nullptr;
  target = fn;
  prev = get_relation_info_hook;
  get_relation_info_hook = [](PlannerInfo* root, Oid relid, bool inhparent, RelOptInfo* rel) {
    if (prev != nullptr) prev(root, relid, inhparent, rel);
    target(relid, rel);
  };
}
#endif

// Calls a PostgreSQL signal handler (die, ...) from inside relaybus's own
// handler, declared with SIGNAL_ARGS, passing its arguments on: 19 gave
// SIGNAL_ARGS a second argument (the sender's pid and uid).
#if PG_VERSION_NUM >= 190000
#define RELAYBUS_FORWARD_SIGNAL(handler) handler(postgres_signal_arg, pg_siginfo)
#else
#define RELAYBUS_FORWARD_SIGNAL(handler) handler(postgres_signal_arg)
#endif

// A WaitEventSet for nevents events, which the caller frees with
// FreeWaitEventSet. kept: it outlives transactions (freed explicitly only);
// otherwise it lasts one wait, and an error before the free releases it where
// the major can (17+: the current resource owner; 15 and 16: its memory goes
// with the current memory context). 17 made the first argument a resource
// owner instead of a memory context (the set always lives in TopMemoryContext).
static inline WaitEventSet* relaybus_wait_event_set(bool kept, int nevents) {
#if PG_VERSION_NUM >= 170000
  return CreateWaitEventSet(kept ? nullptr : CurrentResourceOwner, nevents);
#else
  return CreateWaitEventSet(kept ? TopMemoryContext : CurrentMemoryContext, nevents);
#endif
}

// ------------------------------------------------------------- shared memory

// A fixed-size shared hash table of nelems entries (HASH_FIXED_SIZE in flags).
// 19 has one size where 15-18 had an initial and a maximum size.
static inline HTAB* relaybus_shmem_init_fixed_hash(const char* name, long nelems, HASHCTL* info, int flags) {
#if PG_VERSION_NUM >= 190000
  return ShmemInitHash(name, nelems, info, flags);
#else
  return ShmemInitHash(name, nelems, nelems, info, flags);
#endif
}

// ------------------------------------------------------------- table access

// index_beginscan without instrumentation (18 added the argument; 19 added
// scan option flags, none of which relaybus uses).
static inline IndexScanDesc relaybus_index_beginscan(Relation heap, Relation index, Snapshot snapshot, int nkeys,
                                                     int norderbys) {
#if PG_VERSION_NUM >= 190000
  return index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys, SO_NONE);
#elif PG_VERSION_NUM >= 180000
  return index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys);
#else
  return index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

// table_tuple_update of a table whose only index is a btree: *index_needs_entry
// says whether the new version needs its own index entry (not a HOT update).
// 16 turned the bool into TU_UpdateIndexes, whose TU_Summarizing means that
// only summarizing (BRIN) indexes need one: none here. 19 added options.
static inline TM_Result relaybus_table_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot* slot, CommandId cid,
                                                    Snapshot snapshot, Snapshot crosscheck, bool wait,
                                                    TM_FailureData* tmfd, LockTupleMode* lockmode,
                                                    bool* index_needs_entry) {
#if PG_VERSION_NUM >= 160000
  TU_UpdateIndexes update_indexes = TU_None;
#if PG_VERSION_NUM >= 190000
  TM_Result r =
      table_tuple_update(rel, otid, slot, cid, 0, snapshot, crosscheck, wait, tmfd, lockmode, &update_indexes);
#else
  TM_Result r = table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck, wait, tmfd, lockmode, &update_indexes);
#endif
  *index_needs_entry = update_indexes == TU_All;
  return r;
#else
  return table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck, wait, tmfd, lockmode, index_needs_entry);
#endif
}

// The index entries of a newly inserted row (not an update, no arbiter
// indexes, duplicates an error), as COPY makes them; returns the indexes
// whose deferred constraints need a recheck. 16 added onlySummarizing; 19
// folded the bools into flags and reordered the arguments.
static inline List* relaybus_insert_index_tuples(ResultRelInfo* rri, TupleTableSlot* slot, EState* estate) {
#if PG_VERSION_NUM >= 190000
  return ExecInsertIndexTuples(rri, estate, 0, slot, NIL, nullptr);
#elif PG_VERSION_NUM >= 160000
  return ExecInsertIndexTuples(rri, slot, estate, false, false, nullptr, NIL, false);
#else
  return ExecInsertIndexTuples(rri, slot, estate, false, false, nullptr, NIL);
#endif
}

// ------------------------------------------------------------- privileges

// Whether the current user owns the database or the extension. 16 replaced
// the per-kind ownerchecks with object_ownercheck.
static inline bool relaybus_owns_database(Oid dboid) {
#if PG_VERSION_NUM >= 160000
  return object_ownercheck(DatabaseRelationId, dboid, GetUserId());
#else
  return pg_database_ownercheck(dboid, GetUserId());
#endif
}

static inline bool relaybus_owns_extension(Oid extoid) {
#if PG_VERSION_NUM >= 160000
  return object_ownercheck(ExtensionRelationId, extoid, GetUserId());
#else
  return pg_extension_ownercheck(extoid, GetUserId());
#endif
}

// Whether the current user may create objects in the tablespace. 16 replaced
// the per-kind aclchecks with object_aclcheck.
static inline bool relaybus_may_create_in_tablespace(Oid tablespace) {
#if PG_VERSION_NUM >= 160000
  return object_aclcheck(TableSpaceRelationId, tablespace, GetUserId(), ACL_CREATE) == ACLCHECK_OK;
#else
  return pg_tablespace_aclcheck(tablespace, GetUserId(), ACL_CREATE) == ACLCHECK_OK;
#endif
}

// ------------------------------------------------------------- settings

// transaction_timeout exists from 17 on (the dispatchers pin it to 0 there).
#define RELAYBUS_PG_HAS_TRANSACTION_TIMEOUT (PG_VERSION_NUM >= 170000)

// ------------------------------------------------------------- search path

// The search path of PostgreSQL's own maintenance commands (17's
// GUC_SAFE_SEARCH_PATH): the catalog first, the session's temporary schema
// last and for relations only (never for functions, operators or types).
#define RELAYBUS_SAFE_SEARCH_PATH "pg_catalog, pg_temp"

// Sets search_path to RELAYBUS_SAFE_SEARCH_PATH in the current GUC nest level
// (the caller opened it with NewGUCNestLevel and closes it with AtEOXact_GUC).
// 17 has this as RestrictSearchPath (and removed the override search paths
// that relaybus used on 15 and 16); before 17 it is the same call.
static inline void relaybus_restrict_search_path() {
#if PG_VERSION_NUM >= 170000
  RestrictSearchPath();
#else
  (void)set_config_option("search_path", RELAYBUS_SAFE_SEARCH_PATH, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true,
                          0, false);
#endif
}
