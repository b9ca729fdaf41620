#include "pg/dispatcher_state.hpp"

namespace relaybus::pg {

void remember_inflight(DispatcherState* st, int64 id, const LeaseToken& token) {
  if (st->ninflight == st->inflight_cap) {
    int cap = st->inflight_cap == 0 ? 1024 : st->inflight_cap * 2;
    st->inflight =
        static_cast<int64*>(st->inflight == nullptr ? MemoryContextAlloc(TopMemoryContext, sizeof(int64) * cap)
                                                    : repalloc(st->inflight, sizeof(int64) * cap));
    st->inflight_tokens = static_cast<LeaseToken*>(st->inflight_tokens == nullptr
                                                       ? MemoryContextAlloc(TopMemoryContext, sizeof(LeaseToken) * cap)
                                                       : repalloc(st->inflight_tokens, sizeof(LeaseToken) * cap));
    st->inflight_cap = cap;
  }
  st->inflight_tokens[st->ninflight] = token;
  st->inflight[st->ninflight++] = id;
}

void release_inflight(DispatcherState* st) {
  leases_release(st->inflight, st->inflight_tokens, st->ninflight);
  st->ninflight = 0;
}

void note_next_ready(DispatcherState* st, const ClaimResult* res) {
  if (res->next_ready_ms > 0 && (st->next_ready_ms == 0 || res->next_ready_ms < st->next_ready_ms))
    st->next_ready_ms = res->next_ready_ms;
}

bool notify_busy(const DispatcherState* st, int32 handler_id) {
  for (int i = 0; i < st->nbusy_notify; i++)
    if (st->busy_notify[i] == handler_id) return true;
  return false;
}

void note_notify_batch(DispatcherState* st, int32 handler_id, bool full) {
  for (int i = 0; i < st->nbusy_notify; i++) {
    if (st->busy_notify[i] != handler_id) continue;
    if (!full) st->busy_notify[i] = st->busy_notify[--st->nbusy_notify];
    return;
  }
  if (full && st->nbusy_notify < DispatcherState::kMaxBusyNotify) st->busy_notify[st->nbusy_notify++] = handler_id;
}

}  // namespace relaybus::pg
