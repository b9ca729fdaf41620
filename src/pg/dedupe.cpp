#include "pg/dedupe.hpp"

#include <string_view>

#include "core/lane_hash.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"

extern "C" {
#include "storage/lock.h"
}

namespace relaybus::pg {

static SavedPlan find_plan = {
    "SELECT event_id FROM relay.dedupe WHERE key = $1 AND expires_at > pg_catalog.now()", 1, {TEXTOID}, nullptr};

static SavedPlan record_plan = {
    "INSERT INTO relay.dedupe AS d (key, event_id, expires_at)"
    " VALUES ($1, $2, pg_catalog.now() + $3 * interval '1 second')"
    " ON CONFLICT (key) DO UPDATE SET event_id = excluded.event_id, expires_at = excluded.expires_at",
    3,
    {TEXTOID, INT8OID, INT4OID},
    nullptr};

// SKIP LOCKED: a dispatcher never waits for a publisher (which may hold the
// row's key lock and wait for something else).
static SavedPlan cleanup_plan = {
    "DELETE FROM relay.dedupe WHERE ctid = ANY (ARRAY(SELECT ctid FROM relay.dedupe"
    " WHERE expires_at <= pg_catalog.now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))",
    1,
    {INT4OID},
    nullptr};

static int cmp_uint64(const void* a, const void* b) {
  uint64 x = *static_cast<const uint64*>(a), y = *static_cast<const uint64*>(b);
  return x < y ? -1 : (x > y ? 1 : 0);
}

void check_dedupe_key(const char* key, int len, int element) {
  if (len <= guc_max_key_bytes) return;
  if (element > 0)
    ereport(ERROR, (errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
                    errmsg("dedupe_key is too long: dedupe_keys[%d] has %d bytes", element, len),
                    errdetail("relaybus.max_key_bytes is %d.", guc_max_key_bytes)));
  ereport(ERROR, (errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION), errmsg("dedupe_key is too long: %d bytes", len),
                  errdetail("relaybus.max_key_bytes is %d.", guc_max_key_bytes)));
}

void dedupe_lock(char** keys, const int* lens, int n) {
  uint64* hashes = static_cast<uint64*>(palloc(sizeof(uint64) * (n + 1)));
  for (int i = 0; i < n; i++) hashes[i] = core::fnv1a64(std::string_view(keys[i], lens[i]));
  qsort(hashes, n, sizeof(uint64), cmp_uint64);
  for (int i = 0; i < n; i++) {
    if (i > 0 && hashes[i] == hashes[i - 1]) continue;
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hashes[i] >> 32), static_cast<uint32>(hashes[i]), 4);
    (void)LockAcquire(&tag, ExclusiveLock, false, false);
  }
  pfree(hashes);
}

bool dedupe_find(const char* key, int64* event_id) {
  Datum k = CStringGetTextDatum(key);
  SpiScope scope;
  spi_begin(&scope);
  // The latest snapshot: the previous holder of the key's lock has ended.
  spi_exec_latest(&find_plan, &k, nullptr, true, 1);
  bool found = SPI_processed > 0;
  if (found) *event_id = spi_int64(0, 1);
  spi_end(&scope);
  return found;
}

void dedupe_record(const char* key, int64 event_id) {
  Datum values[3] = {CStringGetTextDatum(key), Int64GetDatum(event_id), Int32GetDatum(guc_dedupe_window_s)};
  SpiScope scope;
  spi_begin(&scope);
  spi_exec_latest(&record_plan, values, nullptr, false, 0);
  spi_end(&scope);
}

int64 dedupe_cleanup(int limit) {
  Oid nsp = get_namespace_oid("relay", true);
  if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("dedupe", nsp))) return 0;
  Datum l = Int32GetDatum(limit);
  SpiScope scope;
  spi_begin(&scope);
  spi_exec(&cleanup_plan, &l, nullptr, false, 0);
  int64 n = static_cast<int64>(SPI_processed);
  spi_end(&scope);
  return n;
}

}  // namespace relaybus::pg
