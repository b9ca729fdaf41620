#include "pg/key_counter.hpp"
#include "pg/pg_compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_opfamily.h"
#include "executor/tuptable.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/relcache.h"
}

namespace relaybus::pg {

namespace {

Oid cached_schema = InvalidOid;
Oid key_seqs_oid = InvalidOid;

// relay.key_seqs (key text PRIMARY KEY, seq bigint NOT NULL) and nothing else:
// no triggers, row security, CHECK constraints or other indexes. Sets *index_oid.
bool as_created(Relation rel, Oid* index_oid) {
  if (rel->rd_rel->relkind != RELKIND_RELATION || rel->trigdesc != nullptr || rel->rd_rel->relrowsecurity) return false;
  TupleDesc desc = RelationGetDescr(rel);
  if (desc->natts != 2 || (desc->constr != nullptr && desc->constr->num_check > 0)) return false;
  Form_pg_attribute key = TupleDescAttr(desc, 0);
  Form_pg_attribute seq = TupleDescAttr(desc, 1);
  if (key->attisdropped || key->atttypid != TEXTOID || strcmp(NameStr(key->attname), "key") != 0 || seq->attisdropped ||
      seq->atttypid != INT8OID || strcmp(NameStr(seq->attname), "seq") != 0 || seq->attgenerated != '\0')
    return false;
  List* indexes = RelationGetIndexList(rel);
  bool one = list_length(indexes) == 1;
  *index_oid = one ? linitial_oid(indexes) : InvalidOid;
  list_free(indexes);
  return one;
}

bool index_as_created(Relation idx) {
  return idx->rd_index->indisunique && idx->rd_index->indnatts == 1 && idx->rd_index->indkey.values[0] == 1 &&
         idx->rd_rel->relam == BTREE_AM_OID && idx->rd_opfamily[0] == TEXT_BTREE_FAM_OID &&
         RelationGetIndexPredicate(idx) == NIL;
}

// relay.key_seqs and its primary key, opened and checked; false (nothing
// left open) when they are not as this version created them.
bool open_counters(Relation* rel_out, Relation* idx_out) {
  Oid nsp = get_namespace_oid("relay", true);
  if (!OidIsValid(nsp)) return false;  // the statement reports it
  if (nsp != cached_schema || !OidIsValid(key_seqs_oid)) {
    key_seqs_oid = get_relname_relid("key_seqs", nsp);
    cached_schema = nsp;
    if (!OidIsValid(key_seqs_oid)) return false;
  }
  Relation rel = table_open(key_seqs_oid, RowExclusiveLock);
  Oid index_oid = InvalidOid;
  if (!as_created(rel, &index_oid)) {
    table_close(rel, NoLock);
    return false;
  }
  Relation idx = index_open(index_oid, RowExclusiveLock);
  if (!index_as_created(idx)) {
    index_close(idx, NoLock);
    table_close(rel, NoLock);
    return false;
  }
  *rel_out = rel;
  *idx_out = idx;
  return true;
}

void close_counters(Relation rel, Relation idx) {
  index_close(idx, NoLock);
  table_close(rel, NoLock);  // locks stay until the end of the transaction
}

// Adds `add` to the key's row, found through the primary key with `snapshot`.
CounterBump bump_one(Relation rel, Relation idx, IndexInfo** index_info, Snapshot snapshot, Datum key, int64 add,
                     int64* seq) {
  ScanKeyData scan_key;
  ScanKeyEntryInitialize(&scan_key, 0, 1, BTEqualStrategyNumber, InvalidOid, idx->rd_indcollation[0], F_TEXTEQ, key);
  IndexScanDesc scan = relaybus_index_beginscan(rel, idx, snapshot, 1, 0);
  index_rescan(scan, &scan_key, 1, nullptr, 0);
  TupleTableSlot* old_row = table_slot_create(rel, nullptr);
  TupleTableSlot* new_row = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsVirtual);

  CounterBump result = CounterBump::NoRow;
  if (index_getnext_slot(scan, ForwardScanDirection, old_row)) {
    slot_getallattrs(old_row);
    int64 next = DatumGetInt64(old_row->tts_values[1]) + add;
    ExecClearTuple(new_row);
    new_row->tts_values[0] = old_row->tts_values[0];
    new_row->tts_isnull[0] = false;
    new_row->tts_values[1] = Int64GetDatum(next);
    new_row->tts_isnull[1] = false;
    ExecStoreVirtualTuple(new_row);
    TM_FailureData failure;
    LockTupleMode lock_mode;
    bool update_indexes = false;
    TM_Result r = relaybus_table_tuple_update(rel, &old_row->tts_tid, new_row, GetCurrentCommandId(true), snapshot,
                                              InvalidSnapshot, true, &failure, &lock_mode, &update_indexes);
    if (r == TM_Ok) {
      // Not a HOT update (no room on the page): the new version needs its index entry.
      if (update_indexes) {
        if (*index_info == nullptr) *index_info = BuildIndexInfo(idx);
        index_insert(idx, new_row->tts_values, new_row->tts_isnull, &new_row->tts_tid, rel, UNIQUE_CHECK_YES, false,
                     *index_info);
      }
      *seq = next;
      result = CounterBump::Bumped;
    } else {
      // Changed by someone who does not take the key's lock: the UPDATE
      // statement has the executor's rules for that.
      result = CounterBump::UseSql;
    }
  }
  index_endscan(scan);
  ExecDropSingleTupleTableSlot(old_row);
  ExecDropSingleTupleTableSlot(new_row);
  return result;
}

}  // namespace

CounterBump key_counter_bump(Datum key, int64* seq) {
  Relation rel;
  Relation idx;
  if (!open_counters(&rel, &idx)) return CounterBump::UseSql;
  // The latest snapshot: the previous holder of the key's lock has committed.
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  IndexInfo* index_info = nullptr;
  CounterBump result = bump_one(rel, idx, &index_info, snapshot, key, 1, seq);
  UnregisterSnapshot(snapshot);
  close_counters(rel, idx);
  // As after an SPI statement: the next bump in this transaction sees this one.
  if (result == CounterBump::Bumped) CommandCounterIncrement();
  return result;
}

void key_counter_bump_batch(int n, const Datum* keys, const int64* adds, CounterBump* results, int64* seqs) {
  Relation rel;
  Relation idx;
  if (!open_counters(&rel, &idx)) {
    for (int i = 0; i < n; i++) results[i] = CounterBump::UseSql;
    return;
  }
  // One latest snapshot for all: every previous holder of these keys' locks
  // has committed, and each key is updated once (they are distinct).
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  IndexInfo* index_info = nullptr;
  bool any = false;
  for (int i = 0; i < n; i++) {
    results[i] = bump_one(rel, idx, &index_info, snapshot, keys[i], adds[i], &seqs[i]);
    any = any || results[i] == CounterBump::Bumped;
  }
  UnregisterSnapshot(snapshot);
  close_counters(rel, idx);
  if (any) CommandCounterIncrement();
}

}  // namespace relaybus::pg
