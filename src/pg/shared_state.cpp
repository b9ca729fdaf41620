#include "pg/shared_state.hpp"

#include "pg/claim_frontier.hpp"
#include "pg/leases.hpp"
#include "pg/worker_state.hpp"

namespace relaybus::pg {

SharedState* shared = nullptr;

void request_shared_memory() {
  RequestAddinShmemSpace(MAXALIGN(sizeof(SharedState)));
  RequestAddinShmemSpace(leases_shmem_size());
  RequestAddinShmemSpace(worker_state_size());
  RequestAddinShmemSpace(claim_frontier_shmem_size());
  RequestNamedLWLockTranche("relaybus", 2);
}

void init_shared_memory() {
  bool found = false;
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  shared = static_cast<SharedState*>(ShmemInitStruct("relaybus", sizeof(SharedState), &found));
  if (!found) {
    shared->lease_lock = &(GetNamedLWLockTranche("relaybus"))->lock;
    pg_atomic_init_u64(&shared->catalog_generation, 1);
    pg_atomic_init_u64(&shared->trace_context_ignored, 0);
  }
  leases_shmem_init();
  claim_frontier_shmem_init();
  bool workers_found = false;
  workers = static_cast<WorkerState*>(ShmemInitStruct("relaybus workers", worker_state_size(), &workers_found));
  worker_state_init(workers_found);
  if (!workers_found) workers->lock = &(GetNamedLWLockTranche("relaybus"))[1].lock;
  LWLockRelease(AddinShmemInitLock);
}

}  // namespace relaybus::pg
