#pragma once

namespace relaybus::pg {

// From _PG_init: the launcher starts after recovery and is restarted if it dies.
void register_launcher();

}  // namespace relaybus::pg
