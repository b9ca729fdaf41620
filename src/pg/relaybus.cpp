// Entry point: settings, shared memory and transaction hooks.

#include "pg/boundary.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/launcher.hpp"
#include "pg/worker_state.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/plan_settings.hpp"
#include "pg/settings.hpp"
#include "pg/shared_state.hpp"

extern "C" {
PG_MODULE_MAGIC;
PGDLLEXPORT void _PG_init(void);
}

using namespace relaybus::pg;

namespace relaybus::pg {
void install_utility_hook();
void utility_at_xact_end(bool commit);
void utility_at_subxact_end(bool commit, int nest_level);
}  // namespace relaybus::pg

static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

static void relay_shmem_request() {
  if (prev_shmem_request_hook) prev_shmem_request_hook();
  request_shared_memory();
}

static void relay_shmem_startup() {
  if (prev_shmem_startup_hook) prev_shmem_startup_hook();
  init_shared_memory();
}

static void relay_xact_callback(XactEvent event, void*) {
  switch (event) {
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_PARALLEL_COMMIT:
      leases_at_xact_end(true);
      // The catalog generation moves before the dispatchers are woken:
      // a woken dispatcher must find it moved and reload.
      catalog_at_xact_end(true);
      workers_at_xact_end(true);
      utility_at_xact_end(true);
      break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
    case XACT_EVENT_PREPARE:
      // A prepared transaction's completions keep their leases until they lapse.
      leases_at_xact_end(false);
      catalog_at_xact_end(false);
      workers_at_xact_end(false);
      utility_at_xact_end(false);
      break;
    default:
      break;
  }
}

static void relay_subxact_callback(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
  if (event == SUBXACT_EVENT_ABORT_SUB) {
    leases_at_subxact_abort(GetCurrentTransactionNestLevel());
    published_at_subxact_end(false, GetCurrentTransactionNestLevel());
    utility_at_subxact_end(false, GetCurrentTransactionNestLevel());
  } else if (event == SUBXACT_EVENT_COMMIT_SUB) {
    leases_at_subxact_commit(GetCurrentTransactionNestLevel());
    published_at_subxact_end(true, GetCurrentTransactionNestLevel());
    utility_at_subxact_end(true, GetCurrentTransactionNestLevel());
  }
}

extern "C" void _PG_init(void) {
  if (!process_shared_preload_libraries_in_progress)
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("relaybus must be loaded through shared_preload_libraries"),
                    errhint("Add relaybus to shared_preload_libraries in postgresql.conf and restart the server.")));
  define_settings();
  define_boundary_settings();
  prev_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = relay_shmem_request;
  prev_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = relay_shmem_startup;
  RegisterXactCallback(relay_xact_callback, nullptr);
  install_utility_hook();
  install_plan_shape_hook();
  register_launcher();
  RegisterSubXactCallback(relay_subxact_callback, nullptr);
}
