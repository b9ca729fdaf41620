// The NOTIFY payload of a claimed delivery, as text.
#pragma once

#include "pg/claim.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// The JSON object a notify handler's consumer receives for a claimed
// delivery, palloc'd: byte for byte what
// jsonb_build_object('id', .., 'event_id', .., 'topic', .., 'key', ..,
// 'seq', .., 'attempt', .., 'headers', .., 'payload', ..)::text gives.
char* notify_payload_json(const ClaimedRow& row);

// The same delivery by reference (its payload too large to send inline, or the
// handler's "inline_payload": false): {"id", "event_id", "topic", "key", "seq",
// "attempt", "ref": true}, palloc'd; the consumer fetches it with relay_payload.
char* notify_reference_json(const ClaimedRow& row);

}  // namespace relaybus::pg
