// Recording a failed attempt; shared by relay_nack and the dispatchers.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// Within spi_begin()/spi_end(): one more failed attempt of delivery id, with an
// optional error text (Datum 0 = none); retry_in_ms < 0 uses the handler's
// backoff; status is the HTTP status of the attempt (0 = none), kept with a dead
// letter; force_dead dead-letters at once (a permanent failure). Returns "retry"
// or "dead", or "gone" when the delivery no longer exists and missing_ok (else
// that is an error, P0002). It does not check the lease: the caller first
// marks it with leases_begin_completion (or leases_begin_charge), which also
// releases it when the transaction commits.
const char* nack_delivery(int64 id, Datum error, int64 retry_in_ms, int status, bool force_dead,
                          bool missing_ok);

}  // namespace relaybus::pg
