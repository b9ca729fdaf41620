#include "pg/shared_state.hpp"

#include "pg/leases.hpp"

namespace relaybus::pg {

SharedState* shared = nullptr;

void request_shared_memory() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(SharedState)));
    RequestAddinShmemSpace(leases_shmem_size());
    RequestNamedLWLockTranche("relaybus", 1);
}

void init_shared_memory() {
    bool found = false;
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    shared = static_cast<SharedState*>(ShmemInitStruct("relaybus", sizeof(SharedState), &found));
    if (!found) {
        shared->lease_lock = &(GetNamedLWLockTranche("relaybus"))->lock;
        pg_atomic_init_u64(&shared->catalog_generation, 1);
    }
    leases_shmem_init();
    LWLockRelease(AddinShmemInitLock);
}

}  // namespace relaybus::pg
