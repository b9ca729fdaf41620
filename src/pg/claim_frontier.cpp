#include "pg/claim_frontier.hpp"

extern "C" {
#include "common/hashfn.h"
#include "storage/spin.h"
}

namespace relaybus::pg {

namespace {

constexpr int kSlots = 256;

struct FrontierSlot {
  Oid dboid;  // InvalidOid: free
  int32 handler_id;
  int64 from[4];
  uint64 gen;
  TimestampTz valid_until;  // 0: no frontier
  TimestampTz head_until;   // a claim is scanning from the head until then (at most)
  FloorState floor;
  uint64 floor_gen;
  int nkeys;  // key hashes (claim_frontier.hpp): a superset of the keys blocked below from[]
  uint64 keys[kFrontierKeys];
};

struct FrontierTable {
  slock_t mutex;  // a few loads and stores under it, never a call
  FrontierSlot slots[kSlots];
};

FrontierTable* table = nullptr;

// The handler's slot (created when create), or nullptr when the table is
// full: then the slot unused the longest (expired before stale_before) is
// taken over. Slots are never emptied, so probe chains stay whole.
FrontierSlot* slot_of(int32 handler_id, bool create, TimestampTz stale_before) {
  uint32 h = (static_cast<uint32>(MyDatabaseId) * 2654435761u) ^ (static_cast<uint32>(handler_id) * 40503u);
  FrontierSlot* stale = nullptr;
  for (int probe = 0; probe < kSlots; probe++) {
    FrontierSlot* s = &table->slots[(h + probe) % kSlots];
    if (s->dboid == MyDatabaseId && s->handler_id == handler_id) return s;
    if (s->dboid == InvalidOid) {
      stale = s;
      break;
    }
    if (s->valid_until < stale_before && (stale == nullptr || s->valid_until < stale->valid_until)) stale = s;
  }
  if (!create || stale == nullptr) return nullptr;
  uint64 floor_gen = stale->floor_gen + 1;  // a view of the handler it served is dropped
  memset(stale, 0, sizeof(*stale));
  stale->dboid = MyDatabaseId;
  stale->handler_id = handler_id;
  floor_state_init(&stale->floor);
  stale->floor_gen = floor_gen;
  return stale;
}

bool has_key(const uint64* keys, int nkeys, uint64 key_hash) {
  for (int k = 0; k < nkeys; k++)
    if (keys[k] == key_hash) return true;
  return false;
}

// Adds the keys of the passed rows below upto[]; where the set is full the
// frontier stays at that row, so that scans from it see the row.
void add_passed(FrontierSlot* s, const FrontierPassed* passed, int npassed, int64 upto[4]) {
  for (int i = 0; i < npassed; i++) {
    int p = passed[i].priority;
    if (passed[i].id >= upto[p] || has_key(s->keys, s->nkeys, passed[i].key_hash)) continue;
    if (s->nkeys < kFrontierKeys)
      s->keys[s->nkeys++] = passed[i].key_hash;
    else
      upto[p] = passed[i].id;
  }
}

void forget_floor(FrontierSlot* s) {
  floor_state_init(&s->floor);
  s->floor_gen++;
}

// Handlers whose floor this transaction noted: forgotten if it or one of its
// subtransactions aborts (its claims did not see its own deletes, which are
// back then).
int32 noted[8];
int nnoted = 0;
bool noted_overflow = false;
bool callback_registered = false;

void forget_noted() {
  if ((nnoted > 0 || noted_overflow) && table != nullptr) {
    SpinLockAcquire(&table->mutex);
    for (int i = 0; i < kSlots; i++) {
      FrontierSlot* s = &table->slots[i];
      if (s->dboid != MyDatabaseId) continue;
      bool hit = noted_overflow;
      for (int k = 0; k < nnoted && !hit; k++) hit = s->handler_id == noted[k];
      if (hit) forget_floor(s);
    }
    SpinLockRelease(&table->mutex);
  }
}

void floors_at_xact_end(XactEvent event, void*) {
  if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PREPARE && event != XACT_EVENT_COMMIT) return;
  if (event != XACT_EVENT_COMMIT) forget_noted();  // a prepared transaction may still roll back
  nnoted = 0;
  noted_overflow = false;
}

void floors_at_subabort(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
  if (event == SUBXACT_EVENT_ABORT_SUB) forget_noted();
}

void note_in_xact(int32 handler_id) {
  if (!callback_registered) {
    RegisterXactCallback(floors_at_xact_end, nullptr);
    RegisterSubXactCallback(floors_at_subabort, nullptr);
    callback_registered = true;
  }
  for (int k = 0; k < nnoted; k++)
    if (noted[k] == handler_id) return;
  if (nnoted < static_cast<int>(lengthof(noted)))
    noted[nnoted++] = handler_id;
  else
    noted_overflow = true;
}

// Slots of handlers nobody claimed for a minute may go to others.
TimestampTz stale_cutoff() { return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), -60000); }

}  // namespace

Size claim_frontier_shmem_size() { return MAXALIGN(sizeof(FrontierTable)); }

void claim_frontier_shmem_init() {
  bool found = false;
  table = static_cast<FrontierTable*>(ShmemInitStruct("relaybus claim frontier", sizeof(FrontierTable), &found));
  if (!found) {
    memset(table, 0, sizeof(*table));
    SpinLockInit(&table->mutex);
  }
}

void frontier_read(int32 handler_id, TimestampTz now, FrontierView* out) {
  memset(out, 0, sizeof(*out));
  out->head = true;
  if (table == nullptr) return;
  SpinLockAcquire(&table->mutex);
  FrontierSlot* s = slot_of(handler_id, false, 0);
  if (s != nullptr) {
    out->gen = s->gen;
    FloorView fv;
    floor_state_view(&s->floor, ~UINT64CONST(0), 0, now, &fv);
    for (int p = 0; p < 4; p++) out->floor[p] = fv.from[p];
    out->floor_gen = s->floor_gen;
    // Once it expired, one claim scans from the head; the others keep
    // using it meanwhile (with 4 consumers all 4 used to, at once).
    bool renewing = s->valid_until != 0 && now < s->head_until;
    if (now < s->valid_until || renewing) {
      out->head = false;
      for (int p = 0; p < 4; p++) out->from[p] = s->from[p];
      out->nkeys = s->nkeys;
      for (int k = 0; k < s->nkeys; k++) out->keys[k] = s->keys[k];
    } else {
      s->head_until = TimestampTzPlusMilliseconds(now, kFrontierMs);
    }
  }
  SpinLockRelease(&table->mutex);
}

uint64 frontier_key_hash(const char* key) {
  return hash_bytes_extended(reinterpret_cast<const unsigned char*>(key), static_cast<int>(strlen(key)), 0);
}

bool frontier_view_has_key(const FrontierView& view, uint64 key_hash) {
  return has_key(view.keys, view.nkeys, key_hash);
}

void frontier_advance(int32 handler_id, const FrontierView& view, const int64 upto_in[4], const FrontierPassed* passed,
                      int npassed, TimestampTz now) {
  if (table == nullptr) return;
  TimestampTz cutoff = TimestampTzPlusMilliseconds(now, -60000);
  int64 upto[4];
  for (int p = 0; p < 4; p++) upto[p] = upto_in[p];
  SpinLockAcquire(&table->mutex);
  FrontierSlot* s = slot_of(handler_id, view.head, cutoff);
  if (s != nullptr && s->gen == view.gen) {
    if (view.head) {
      // This scan read every live row below upto: its keys replace the set.
      s->nkeys = 0;
      add_passed(s, passed, npassed, upto);
      for (int p = 0; p < 4; p++) s->from[p] = upto[p];
      s->valid_until = TimestampTzPlusMilliseconds(now, kFrontierMs);
    } else if (s->valid_until != 0) {
      // A class whose frontier a claim from the head has set below where
      // this scan started has rows this claim did not see: it stays.
      for (int p = 0; p < 4; p++)
        if (s->from[p] < view.from[p]) upto[p] = s->from[p];
      add_passed(s, passed, npassed, upto);
      for (int p = 0; p < 4; p++) s->from[p] = Max(s->from[p], upto[p]);
    }
  }
  SpinLockRelease(&table->mutex);
}

void frontier_note_key(int32 handler_id, uint64 key_hash) {
  if (table == nullptr) return;
  SpinLockAcquire(&table->mutex);
  FrontierSlot* s = slot_of(handler_id, false, 0);
  if (s != nullptr && !has_key(s->keys, s->nkeys, key_hash)) {
    if (s->nkeys < kFrontierKeys) {
      s->keys[s->nkeys++] = key_hash;
    } else {  // no room: the next claim scans from the head and sets a new frontier
      s->valid_until = 0;
      s->gen++;
    }
  }
  SpinLockRelease(&table->mutex);
}

void frontier_lower(int32 handler_id, int64 id) {
  if (table == nullptr) return;
  TimestampTz cutoff = stale_cutoff();
  SpinLockAcquire(&table->mutex);
  // Created if missing: a claim scanning from the head right now must not
  // set a frontier past this row (its view has the old generation).
  FrontierSlot* s = slot_of(handler_id, true, cutoff);
  if (s != nullptr) {
    for (int p = 0; p < 4; p++) s->from[p] = Min(s->from[p], id);
    s->gen++;
  }
  SpinLockRelease(&table->mutex);
}

void frontier_forget(int32 handler_id) {
  if (table == nullptr) return;
  SpinLockAcquire(&table->mutex);
  for (int i = 0; i < kSlots; i++) {
    FrontierSlot* s = &table->slots[i];
    if (s->dboid != MyDatabaseId || (handler_id != 0 && s->handler_id != handler_id)) continue;
    s->valid_until = 0;
    s->gen++;
    s->nkeys = 0;
    forget_floor(s);
  }
  SpinLockRelease(&table->mutex);
}

void frontier_note_floor(int32 handler_id, const FrontierView& view, const FloorView& used, const int64 first[4],
                         const int64 highest[4], TransactionId xmin) {
  if (table == nullptr) return;
  TransactionId next_xid = floor_next_xid();  // an LWLock: before the spinlock
  note_in_xact(handler_id);
  TimestampTz cutoff = stale_cutoff();
  SpinLockAcquire(&table->mutex);
  FrontierSlot* s = slot_of(handler_id, true, cutoff);
  if (s != nullptr && s->floor_gen == view.floor_gen) floor_state_note(&s->floor, used, first, highest, xmin, next_xid);
  SpinLockRelease(&table->mutex);
}

}  // namespace relaybus::pg
