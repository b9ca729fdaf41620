// The session settings a relaybus worker depends on, pinned over whatever
// postgresql.conf, ALTER SYSTEM, ALTER DATABASE ... SET or ALTER ROLE ... SET
// say (docs/architecture.md lists them with why).
#pragma once

namespace relaybus::pg {

// Sets every pinned setting with source PGC_S_OVERRIDE. Call at worker start
// and after every configuration reload.
void pin_session_settings();

}  // namespace relaybus::pg
