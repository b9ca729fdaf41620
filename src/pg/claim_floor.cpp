#include "pg/claim_floor.hpp"

#include <algorithm>

#include "pg/settings.hpp"

extern "C" {
#include "access/transam.h"
}

namespace relaybus::pg {

void floor_state_init(FloorState* f) {
  *f = FloorState{};
  for (int64& h : f->highest) h = -1;
}

void floor_state_view(FloorState* f, uint64 lanes, uint32 rescans, TimestampTz now, FloorView* out) {
  if (f->lanes != lanes || f->rescans != rescans || now >= f->head_due) {
    // Everything learnt goes: ids may have started again (a new extension).
    for (int64& x : f->floor) x = 0;
    for (int64& h : f->highest) h = -1;
    f->pending = false;
    f->lanes = lanes;
    f->rescans = rescans;
    f->head_due = TimestampTzPlusMilliseconds(now, guc_poll_interval_ms);
  }
  out->head = true;
  for (int p = 0; p < 4; p++) {
    out->from[p] = f->floor[p];
    if (f->floor[p] > 0) out->head = false;
  }
}

namespace {
bool candidate_holds(const FloorState* f, TransactionId xmin) {
  return TransactionIdIsNormal(xmin) && TransactionIdFollowsOrEquals(xmin, f->after);
}
}  // namespace

bool floor_state_takes_candidate(const FloorState* f, TransactionId xmin) {
  return !f->pending || candidate_holds(f, xmin);
}

void floor_state_note(FloorState* f, const FloorView& used, const int64 first[4], const int64 highest[4],
                      TransactionId xmin, TransactionId next_xid) {
  int64 seen[4];
  for (int p = 0; p < 4; p++) {
    f->highest[p] = std::max(f->highest[p], highest[p]);
    // Nothing of the class at or past used.from[p] is live now: up to the
    // highest id returned since the reset, every row is settled or uncommitted.
    seen[p] = first[p] >= 0 ? first[p] : std::max(used.from[p], f->highest[p] + 1);
  }
  if (f->pending && candidate_holds(f, xmin)) {
    for (int p = 0; p < 4; p++) f->floor[p] = std::max(f->floor[p], std::min(f->candidate[p], seen[p]));
    f->pending = false;
  }
  if (!f->pending) {
    for (int p = 0; p < 4; p++) f->candidate[p] = seen[p];
    f->after = next_xid;
    f->pending = true;
  }
}

TransactionId floor_next_xid() { return XidFromFullTransactionId(ReadNextFullTransactionId()); }

namespace {

// Per dispatcher process and handler (a few handlers per database; a slot
// taken over by another handler starts from the head, which is always right).
struct DispatcherFloor {
  int32 handler_id;  // 0: none
  FloorState state;
};

DispatcherFloor floors[16];
bool callback_registered = false;

// A claim does not see the rows its own transaction deleted, so its floor may
// pass them; if that transaction (or a subtransaction) aborts they are back. (Rows another
// transaction deleted and then restored by aborting are covered by the
// two-step rule.)
void forget_all() {
  for (DispatcherFloor& f : floors) f.handler_id = 0;
}
void forget_at_abort(XactEvent event, void*) {
  if (event == XACT_EVENT_ABORT) forget_all();
}
void forget_at_subabort(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
  if (event == SUBXACT_EVENT_ABORT_SUB) forget_all();
}

FloorState* floor_of(int32 handler_id) {
  if (!callback_registered) {
    RegisterXactCallback(forget_at_abort, nullptr);
    RegisterSubXactCallback(forget_at_subabort, nullptr);
    callback_registered = true;
  }
  DispatcherFloor* f = &floors[static_cast<uint32>(handler_id) % lengthof(floors)];
  if (f->handler_id != handler_id) {
    f->handler_id = handler_id;
    floor_state_init(&f->state);
  }
  return &f->state;
}

}  // namespace

void floor_read(int32 handler_id, uint64 lanes, uint32 rescans, TimestampTz now, FloorView* out) {
  floor_state_view(floor_of(handler_id), lanes, rescans, now, out);
}

void floor_note(int32 handler_id, const FloorView& used, const int64 first[4], const int64 highest[4],
                TransactionId xmin) {
  FloorState* f = floor_of(handler_id);
  // The next xid (a shared lock) only when a new candidate is noted.
  TransactionId next = floor_state_takes_candidate(f, xmin) ? floor_next_xid() : InvalidTransactionId;
  floor_state_note(f, used, first, highest, xmin, next);
}

}  // namespace relaybus::pg
