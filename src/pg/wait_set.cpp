#include "pg/wait_set.hpp"

#include "pg/cpp/pipeline_host.h"
#include "pg/pg_compat.hpp"
#include "pg/spi_support.hpp"

extern "C" {
#include "pgstat.h"
#include "storage/latch.h"
}

namespace relaybus::pg {

namespace {

// The wait set of wait_for_work, kept across waits while the engine has a
// ready_fd: latch, postmaster death, the kafka producers' fd and the
// engine's. Building a set per wait cost an epoll_create1, an epoll_ctl per
// socket in flight and a close every time.
WaitEventSet* kept_set = nullptr;
int kept_engine_fd = -1, kept_kafka_fd = -1;

void drop_kept_set() {
  if (kept_set != nullptr) FreeWaitEventSet(kept_set);
  kept_set = nullptr;
}

WaitEventSet* kept_wait_set(int engine_fd, int kafka_fd) {
  if (kept_set != nullptr && kept_engine_fd == engine_fd && kept_kafka_fd == kafka_fd) return kept_set;
  drop_kept_set();
  WaitEventSet* set = relaybus_wait_event_set(true, 4);
  AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
  AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
  if (kafka_fd >= 0) AddWaitEventToSet(set, WL_SOCKET_READABLE, kafka_fd, nullptr, nullptr);
  AddWaitEventToSet(set, WL_SOCKET_READABLE, engine_fd, nullptr, nullptr);
  kept_set = set;
  kept_engine_fd = engine_fd;
  kept_kafka_fd = kafka_fd;
  return set;
}

}  // namespace

bool wait_for_work(long timeout_ms) {
  int64 nowms = timestamptz_to_epoch_ms(GetCurrentTimestamp());
  bool running = host_running();
  int cap = running ? host_socket_count() : 0;
  SocketWait none;
  SocketWait* sockets = cap > 0 ? static_cast<SocketWait*>(palloc(sizeof(SocketWait) * cap)) : &none;
  WaitPlan plan;
  int nsock = host_wait_plan(nowms, sockets, cap, &plan);
  // libcurl's own timers (often 0 or 1 ms while transfers run) end the wait
  // too, but they are the engine's business: they do not call for a claim or
  // a completion, so they do not count as a wake-up.
  bool engine_timer = false;
  if (plan.engine_timeout_ms >= 0 && plan.engine_timeout_ms < timeout_ms) {
    timeout_ms = static_cast<long>(plan.engine_timeout_ms);
    engine_timer = true;
  }
  // An open breaker lets its probe through when its backoff ends.
  if (plan.next_probe_ms >= 0 && plan.next_probe_ms - nowms + 1 < timeout_ms) {
    timeout_ms = static_cast<long>(plan.next_probe_ms - nowms + 1);
    engine_timer = false;
  }

  // A handler held back by its limits: the loop's pump sends once a permit
  // may be free; no claim is due for that.
  if (plan.next_permit_ms >= 0 && plan.next_permit_ms - nowms + 1 < timeout_ms) {
    timeout_ms = static_cast<long>(Max(plan.next_permit_ms - nowms, static_cast<int64>(0)) + 1);
    engine_timer = true;
  }

  // A pipelined kafka message's timeout is the sink's own (librdkafka never
  // times it out): served after the wait, like libcurl's timers no wake-up.
  if (plan.kafka_timer_ms >= 0 && plan.kafka_timer_ms + 1 < timeout_ms) {
    timeout_ms = static_cast<long>(plan.kafka_timer_ms + 1);
    engine_timer = true;
  }

  // The kafka producers' delivery reports (and errors) make this fd readable.
  int engine_fd = plan.engine_fd, kafka_fd = plan.kafka_fd;
  WaitEventSet* set = nullptr;
  if (engine_fd >= 0) {
    set = kept_wait_set(engine_fd, kafka_fd);
  } else {
    drop_kept_set();
    set = relaybus_wait_event_set(false, nsock + 3);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (kafka_fd >= 0) AddWaitEventToSet(set, WL_SOCKET_READABLE, kafka_fd, nullptr, nullptr);
    for (int i = 0; i < nsock; i++)
      AddWaitEventToSet(set, (sockets[i].read ? WL_SOCKET_READABLE : 0) | (sockets[i].write ? WL_SOCKET_WRITEABLE : 0),
                        sockets[i].fd, nullptr, nullptr);
  }
  WaitEvent occurred[64];
  int n = WaitEventSetWait(set, timeout_ms, occurred, lengthof(occurred), PG_WAIT_EXTENSION);
  if (engine_fd < 0) FreeWaitEventSet(set);
  bool latch = false;
  for (int i = 0; i < n; i++)
    if (occurred[i].events & WL_LATCH_SET) latch = true;
  if (latch) ResetLatch(MyLatch);
  bool woken = latch || (n == 0 && !engine_timer);  // n == 0: the timeout passed
  if (!running) return woken;
  bool kafka_ready = false;
  SocketWait ready[lengthof(occurred)];
  int nready = 0;
  for (int i = 0; i < n; i++) {
    const WaitEvent& e = occurred[i];
    if (e.fd == kafka_fd && (e.events & WL_SOCKET_READABLE)) kafka_ready = true;
    if (e.fd == kafka_fd || e.fd == PGINVALID_SOCKET) continue;
    ready[nready++] = SocketWait{e.fd, (e.events & WL_SOCKET_READABLE) != 0, (e.events & WL_SOCKET_WRITEABLE) != 0};
  }
  host_after_wait(engine_fd, ready, nready, kafka_ready, n == 0);
  for (int i = 0; i < host_log_count(); i++) ereport(LOG, (errmsg("relaybus dispatcher: %s", host_log_line(i))));
  host_log_clear();
  return woken;
}

void wait_set_close() { drop_kept_set(); }

}  // namespace relaybus::pg
