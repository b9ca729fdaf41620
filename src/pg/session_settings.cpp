#include "pg/session_settings.hpp"

#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"
#include "pg/settings.hpp"

namespace relaybus::pg {

struct PinnedSetting {
  const char* name;
  const char* value;
};

// Each would otherwise abort iterations (and, before errors were classified,
// charge innocent deliveries) or change what the workers' statements mean.
static const PinnedSetting kPinned[] = {
    // A worker waits only for row locks that relay_ack/relay_nack hold for a
    // moment; a timeout would abort a whole batch. SIGTERM still ends a wait.
    {"lock_timeout", "0"},
    {"statement_timeout", "0"},
    {"idle_in_transaction_session_timeout", "0"},
    {"idle_session_timeout", "0"},
    // The claim's fences are written for READ COMMITTED (a fresh snapshot per
    // statement); SERIALIZABLE would add serialization failures.
    {"default_transaction_isolation", "read committed"},
    {"default_transaction_deferrable", "off"},
    // Completing deletes and updates rows.
    {"default_transaction_read_only", "off"},
    // Every object is schema-qualified; nothing may be found elsewhere first.
    {"search_path", "pg_catalog, pg_temp"},
    // 'replica' would silence the triggers of relay's tables (catalog changes).
    {"session_replication_role", "origin"},
    // 'off' makes a query on a table with row security fail instead of filtering.
    {"row_security", "on"},
    // 'on' would turn every failed iteration into a worker exit.
    {"exit_on_error", "off"},
    // The statements' string literals assume it.
    {"standard_conforming_strings", "on"},
    // The workers run the same few statements all the time, with arrays of ids
    // and lanes as parameters; the plan cache kept choosing custom plans, so a
    // claim was re-planned on every call (planning took as long as executing).
    // The generic plans have the same shapes.
    {"plan_cache_mode", "force_generic_plan"},
#if RELAYBUS_PG_HAS_TRANSACTION_TIMEOUT
    {"transaction_timeout", "0"},
#endif
};

void pin_session_settings() {
  for (const PinnedSetting& s : kPinned) SetConfigOption(s.name, s.value, PGC_SUSET, PGC_S_OVERRIDE);
  // A completion lost in a crash only means the delivery is handed over
  // again, which a crash causes anyway (relaybus.worker_synchronous_commit).
  SetConfigOption("synchronous_commit", guc_worker_synchronous_commit ? "on" : "off", PGC_SUSET, PGC_S_OVERRIDE);
}

}  // namespace relaybus::pg
