#include "pg/dispatch_lanes.hpp"

#include "pg/settings.hpp"

namespace relaybus::pg {

void balance_lanes(DispatcherState* st) {
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz until = TimestampTzPlusMilliseconds(now, guc_lease_timeout_ms);
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  Oid dboid = workers->slots[st->slot].dboid;
  int active = 0;
  for (int s = 0; s < workers->nslots; s++) {
    const DispatcherSlot& o = workers->slots[s];
    if (o.dboid == dboid && o.pid != 0 &&
        (s == st->slot || o.heartbeat > TimestampTzPlusMilliseconds(now, -guc_lease_timeout_ms)))
      active++;
  }
  int fair = (kNumLanes + active - 1) / Max(active, 1);
  LaneLease* lanes = workers->lanes[st->db];
  int held = 0;
  for (int l = 0; l < kNumLanes; l++) {
    if (lanes[l].owner_slot != st->slot) continue;
    if (held >= fair) {
      lanes[l].owner_slot = -1;  // give the surplus to the others
      continue;
    }
    lanes[l].until = until;
    held++;
  }
  for (int l = 0; l < kNumLanes && held < fair; l++) {
    if (lanes[l].owner_slot == -1 || lanes[l].until < now) {
      lanes[l].owner_slot = st->slot;
      lanes[l].token = workers->next_token++;
      lanes[l].until = until;
      held++;
    }
  }
  st->nlanes = 0;
  for (int l = 0; l < kNumLanes; l++) {
    if (lanes[l].owner_slot == st->slot) {
      st->lanes[st->nlanes] = static_cast<int16>(l);
      st->tokens[st->nlanes++] = lanes[l].token;
    }
  }
  workers->slots[st->slot].heartbeat = now;
  workers->slots[st->slot].lanes_held = st->nlanes;
  LWLockRelease(workers->lock);
}

// No lane filter while this dispatcher holds every lane (one dispatcher per
// database, the common case), so its scan reads the handler's rows without a
// `lane = ANY (64 lanes)` test per row. The same rows either way;
// lanes_still_mine() fences the iteration in both cases.
void claim_lanes(const DispatcherState* st, ClaimRequest* req) {
  bool all = st->nlanes == kNumLanes;
  req->lanes = all ? nullptr : st->lanes;
  req->nlanes = all ? 0 : st->nlanes;
  req->use_floor = true;
  req->rescans = pg_atomic_read_u32(&workers->slots[st->slot].rescans);
}

bool lanes_still_mine(const DispatcherState* st) {
  bool mine = true;
  LWLockAcquire(workers->lock, LW_SHARED);
  for (int i = 0; i < st->nlanes && mine; i++) {
    const LaneLease& l = workers->lanes[st->db][st->lanes[i]];
    mine = l.owner_slot == st->slot && l.token == st->tokens[i];
  }
  LWLockRelease(workers->lock);
  return mine;
}

void lanes_free_locked(const DispatcherState* st) {
  if (st->db < 0) return;
  for (int l = 0; l < kNumLanes; l++)
    if (workers->lanes[st->db][l].owner_slot == st->slot) workers->lanes[st->db][l].owner_slot = -1;
}

}  // namespace relaybus::pg
