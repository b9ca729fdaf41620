// Publisher idempotency: relay_publish's dedupe_key names the first event
// published with it, for relaybus.dedupe_window (relay.dedupe).
//
// Publishers of one dedupe key serialize on a transaction advisory lock on the
// key's hash (its fourth field 4; ordering keys use 3) and look the key up with
// a fresh snapshot once they hold it: the previous holder has committed (its
// row is seen and its event id returned) or rolled back (no row: this publish
// creates the event). A row past its window is replaced by the key's next
// publish and removed by the dispatchers (dedupe_cleanup).
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// Checks a dedupe key's length (relaybus.max_key_bytes); element: 1-based
// position in a batch, or -1.
void check_dedupe_key(const char* key, int len, int element);

// Takes the locks of these keys (n of them, any order, repeats allowed), in
// hash order so that two publishers never deadlock on them.
void dedupe_lock(char** keys, const int* lens, int n);

// Under the key's lock: the event id a live row names, if any.
bool dedupe_find(const char* key, int64* event_id);

// Under the key's lock: key names event_id for relaybus.dedupe_window from now
// (replacing a row past its window).
void dedupe_record(const char* key, int64 event_id);

// In a transaction: removes up to limit rows past their window, skipping rows
// a publisher holds. Nothing if relay.dedupe does not exist (a database not yet
// updated to 0.2.0). Returns how many.
int64 dedupe_cleanup(int limit);

}  // namespace relaybus::pg
