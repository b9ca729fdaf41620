#include "pg/delivery_writer.hpp"
#include "pg/pg_compat.hpp"

extern "C" {
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_class.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "utils/rel.h"
}

namespace relaybus::pg {

namespace {

// relay.deliveries as sql/relaybus--0.1.0.sql creates it.
struct Column {
  const char* name;
  Oid type;
};
constexpr Column kColumns[] = {
    {"id", INT8OID},
    {"event_id", INT8OID},
    {"seq", INT8OID},
    {"published_at", TIMESTAMPTZOID},
    {"not_before", TIMESTAMPTZOID},
    {"handler_id", INT4OID},
    {"attempt", INT4OID},
    {"lane", INT2OID},
    {"priority", INT2OID},
    {"topic", TEXTOID},
    {"wire_topic", TEXTOID},
    {"key", TEXTOID},
    {"payload", JSONBOID},
    {"headers", JSONBOID},
    {"last_error", TEXTOID},
};
constexpr int kNatts = sizeof(kColumns) / sizeof(kColumns[0]);

// Resolved once per relay schema (a new CREATE EXTENSION makes a new schema).
Oid cached_schema = InvalidOid;
Oid deliveries_oid = InvalidOid;
Oid event_seq_oid = InvalidOid;
Oid delivery_seq_oid = InvalidOid;

void resolve() {
  Oid nsp = get_namespace_oid("relay", true);
  if (!OidIsValid(nsp))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_SCHEMA), errmsg("schema \"relay\" does not exist"),
                    errhint("Run CREATE EXTENSION relaybus in this database.")));
  if (nsp == cached_schema && OidIsValid(deliveries_oid)) return;
  Oid deliveries = get_relname_relid("deliveries", nsp);
  Oid event_seq = get_relname_relid("event_id_seq", nsp);
  Oid delivery_seq = get_relname_relid("delivery_id_seq", nsp);
  if (!OidIsValid(deliveries) || !OidIsValid(event_seq) || !OidIsValid(delivery_seq))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("relaybus tables are missing from schema \"relay\""),
                    errhint("Reinstall the extension: DROP EXTENSION relaybus; CREATE EXTENSION relaybus.")));
  deliveries_oid = deliveries;
  event_seq_oid = event_seq;
  delivery_seq_oid = delivery_seq;
  cached_schema = nsp;
}

// Whether a plain heap insert writes exactly what an INSERT statement would:
// no triggers, row security, CHECK constraints or generated columns, and the
// columns of this version.
bool writable_directly(Relation rel) {
  if (rel->rd_rel->relkind != RELKIND_RELATION || rel->trigdesc != nullptr || rel->rd_rel->relrowsecurity) return false;
  TupleDesc desc = RelationGetDescr(rel);
  if (desc->natts != kNatts) return false;
  if (desc->constr != nullptr && (desc->constr->num_check > 0 || desc->constr->has_generated_stored)) return false;
  for (int i = 0; i < kNatts; i++) {
    Form_pg_attribute a = TupleDescAttr(desc, i);
    if (a->attisdropped || a->atttypid != kColumns[i].type || strcmp(NameStr(a->attname), kColumns[i].name) != 0)
      return false;
  }
  return true;
}

void forget_resolved() {
  cached_schema = InvalidOid;
  deliveries_oid = InvalidOid;
}

[[noreturn]] void dropped_concurrently() {
  ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE), errmsg("relaybus was dropped concurrently"),
                  errdetail("DROP EXTENSION relaybus committed while this call waited for it."),
                  errhint("Run CREATE EXTENSION relaybus in this database.")));
}

}  // namespace

void lock_deliveries_for_publish() {
  for (int attempt = 0;; attempt++) {
    if (attempt > 0 && !OidIsValid(get_namespace_oid("relay", true))) dropped_concurrently();
    resolve();
    Oid rel = deliveries_oid;
    // Accepts invalidations once the lock is granted: a table dropped while
    // we waited is gone from the syscache now.
    LockRelationOid(rel, RowExclusiveLock);
    if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(rel))) return;
    UnlockRelationOid(rel, RowExclusiveLock);
    forget_resolved();
    if (attempt > 0) dropped_concurrently();
  }
}

Oid relay_event_seq() {
  resolve();
  return event_seq_oid;
}

bool delivery_writer_open(DeliveryWriter* w) {
  resolve();
  Relation rel = table_open(deliveries_oid, RowExclusiveLock);
  if (!writable_directly(rel)) {
    table_close(rel, RowExclusiveLock);
    return false;
  }
  w->rel = rel;
  w->estate = CreateExecutorState();
  w->rri = makeNode(ResultRelInfo);
  InitResultRelInfo(w->rri, rel, 1, nullptr, 0);
  ExecOpenIndices(w->rri, false);
  w->slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsVirtual);
  w->delivery_seq = delivery_seq_oid;
  w->cid = GetCurrentCommandId(true);
  w->now = GetCurrentTransactionStartTimestamp();  // now()
  return true;
}

void delivery_writer_insert(DeliveryWriter* w, const DeliveryRow& row) {
  TupleTableSlot* slot = w->slot;
  ExecClearTuple(slot);
  Datum* v = slot->tts_values;
  bool* n = slot->tts_isnull;
  memset(n, 0, sizeof(bool) * kNatts);
  v[0] = Int64GetDatum(nextval_internal(w->delivery_seq, false));
  v[1] = Int64GetDatum(row.event_id);
  v[2] = Int64GetDatum(row.seq);
  n[2] = row.key == 0;
  v[3] = TimestampTzGetDatum(w->now);
  v[4] = TimestampTzGetDatum(row.not_before);
  v[5] = Int32GetDatum(row.handler_id);
  v[6] = Int32GetDatum(0);
  v[7] = Int16GetDatum(row.lane);
  v[8] = Int16GetDatum(row.priority);
  v[9] = row.topic;
  v[10] = row.wire_topic;
  n[10] = row.wire_topic == 0;
  v[11] = row.key;
  n[11] = row.key == 0;
  v[12] = row.payload;
  v[13] = row.headers;
  n[13] = row.headers == 0;
  v[14] = (Datum)0;
  n[14] = true;
  ExecStoreVirtualTuple(slot);
  table_tuple_insert(w->rel, slot, w->cid, 0, nullptr);
  List* recheck = relaybus_insert_index_tuples(w->rri, slot, w->estate);
  list_free(recheck);
  ResetPerTupleExprContext(w->estate);
}

void delivery_writer_close(DeliveryWriter* w) {
  ExecCloseIndices(w->rri);
  ExecDropSingleTupleTableSlot(w->slot);
  FreeExecutorState(w->estate);
  table_close(w->rel, NoLock);  // the lock stays until the end of the transaction
  // As after an SPI statement: later commands of this transaction see the rows.
  CommandCounterIncrement();
}

}  // namespace relaybus::pg
