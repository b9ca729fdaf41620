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
    int64 seq;        // ignored when key is 0
    TimestampTz not_before;
    int32 handler_id;
    int16 lane;
    int16 priority;
    Datum topic;      // text
    Datum wire_topic; // text, or 0 for NULL
    Datum key;        // text, or 0 for NULL (the row's seq is then NULL too)
    Datum payload;    // jsonb
    Datum headers;    // jsonb, or 0 for NULL
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

// Opens relay.deliveries for inserting, or returns false (nothing opened) when
// the table is not the one this code knows how to write.
bool delivery_writer_open(DeliveryWriter* w);
// Inserts one row with the next delivery id.
void delivery_writer_insert(DeliveryWriter* w, const DeliveryRow& row);
void delivery_writer_close(DeliveryWriter* w);

}  // namespace relaybus::pg
