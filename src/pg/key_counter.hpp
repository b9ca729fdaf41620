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
    Bumped,    // *seq is the key's new value
    NoRow,     // the key has no counter yet: the caller inserts it
    UseSql,    // not done here (the table is not as this version created it, or
               // the row changed under us): the caller runs its statement
};

CounterBump key_counter_bump(Datum key, int64* seq);

}  // namespace relaybus::pg
