// Refusing hand-overs and completions on a server in recovery (a hot standby).
#pragma once

namespace relaybus::pg {

// Raises 25006 (read_only_sql_transaction) on a server in recovery, naming the
// function. A lease lives in the shared memory of the server that took it: one
// taken on a standby would hand over a delivery the primary hands to another
// consumer too, and would still be held after a promotion. So relay_claim,
// relay_extend, relay_ack and relay_nack run on the primary only.
void refuse_during_recovery(const char* function);

}  // namespace relaybus::pg
