// Writing delivery rows without SPI: a heap insert plus its index entries.
//
// Publishing used to run one INSERT ... SELECT through SPI per call; starting
// that executor plan (opening the table and its indexes, building projections
// and the CTE's subquery scans) cost more than the insert itself. The writer
// opens relay.deliveries once per call and inserts each row with
// table_tuple_insert + ExecInsertIndexTuples, as COPY does.
//
// It only does so for the table as this version of relaybus created it: a table
// with triggers, row security or another layout makes delivery_writer_open()
// return false, and the caller falls back to SPI.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

struct DeliveryRow {
  int64 event_id;
  int64 seq;  // ignored when key is 0
  TimestampTz not_before;
  int32 handler_id;
  int16 lane;
  int16 priority;
  Datum topic;       // text
  Datum wire_topic;  // text, or 0 for NULL
  Datum key;         // text, or 0 for NULL (the row's seq is then NULL too)
  Datum payload;     // jsonb
  Datum headers;     // jsonb, or 0 for NULL
};

struct DeliveryWriter {
  Relation rel;
  EState* estate;
  ResultRelInfo* rri;
  TupleTableSlot* slot;
  Oid delivery_seq;
  CommandId cid;
  TimestampTz now;
};

// Relation ids of relay's sequences (resolved once per relay schema).
Oid relay_event_seq();

// Takes the publisher's lock on relay.deliveries (ROW EXCLUSIVE, which a
// publish holds until it ends anyway) before the publish reads its routes:
// relay_drop_handler locks the table against writers, so a publish either
// commits before a drop of its handler (which then deletes its rows) or reads
// the routes after it. A publish that waited for a DROP EXTENSION relaybus
// fails with 55000 (object_not_in_prerequisite_state) instead of tripping
// over the dropped table's oid.
void lock_deliveries_for_publish();

// Opens relay.deliveries for inserting, or returns false (nothing opened) when
// the table is not the one this code knows how to write.
bool delivery_writer_open(DeliveryWriter* w);
// Inserts one row with the next delivery id.
void delivery_writer_insert(DeliveryWriter* w, const DeliveryRow& row);
void delivery_writer_close(DeliveryWriter* w);

}  // namespace relaybus::pg
