// A keyed event's counter bump without SPI.
//
// For a key that already has a row in relay.key_seqs, relay_publish spent as
// much on starting the UPDATE statement through SPI as on writing the event.
// This finds the row through the primary key with the latest snapshot and
// updates it in place (a HOT update, one WAL record), as the UPDATE would.
//
// The caller holds the key's advisory lock (publish.cpp), so no other publisher
// changes the row meanwhile.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

enum class CounterBump {
  Bumped,  // *seq is the key's new value
  NoRow,   // the key has no counter yet: the caller inserts it
  UseSql,  // not done here (the table is not as this version created it, or
           // the row changed under us): the caller runs its statement
};

CounterBump key_counter_bump(Datum key, int64* seq);

// A batch's distinct keys (text datums, locked by the caller), each bumped by
// adds[i]: results[i] and seqs[i] (the key's new value where Bumped) per key.
// Opens the table and its index once and reads with one latest snapshot, taken
// after the caller locked every key. All UseSql when the table is not as
// created; a key may also come back NoRow or UseSql on its own (the caller
// runs its statement for those).
void key_counter_bump_batch(int n, const Datum* keys, const int64* adds, CounterBump* results, int64* seqs);

}  // namespace relaybus::pg
