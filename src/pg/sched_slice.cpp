// On a busy machine a dispatcher woken by a publisher's commit waits behind
// every other runnable process for the CPU, milliseconds each time, and each
// delivery's latency pays it. Linux's EEVDF scheduler (6.6+; a custom slice
// since 6.12) lets a SCHED_OTHER task ask for a shorter time slice: it keeps
// its fair share of CPU but gets it in short turns that start sooner, so a
// woken dispatcher runs at once instead of after the running task's slice.
// No privilege is needed and nothing changes where it is not supported.
#include "pg/sched_slice.hpp"

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#endif

namespace relaybus::pg {

#if defined(__linux__) && defined(SYS_sched_setattr)
// The kernel's struct sched_attr (include/uapi/linux/sched/types.h); glibc
// has no wrapper for sched_setattr before 2.41.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;  // SCHED_OTHER: the requested slice, in ns
  uint64_t sched_deadline;
  uint64_t sched_period;
};

bool request_time_slice(int slice_us) {
  SchedAttr attr;
  memset(&attr, 0, sizeof(attr));
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0) return false;
  if (attr.sched_policy != 0) return false;  // not SCHED_OTHER: leave it alone
  attr.size = sizeof(attr);
  attr.sched_flags = 0;
  attr.sched_runtime = static_cast<uint64_t>(slice_us > 0 ? slice_us : 0) * 1000;  // 0: the default again
  // The nice value is passed along unchanged (sched_getattr read it).
  return syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
}
#else
bool request_time_slice(int) { return false; }
#endif

}  // namespace relaybus::pg
