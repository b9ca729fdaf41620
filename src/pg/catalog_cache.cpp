#include "pg/catalog_cache.hpp"

#include "pg/boundary.hpp"
#include "pg/shared_state.hpp"
#include "pg/spi_support.hpp"

extern "C" {
#include "access/xlog.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
}

namespace relaybus::pg {

namespace {

static_assert(kNameLen == NAMEDATALEN, "a handler's name is a name");

Catalog* current = nullptr;
uint64 loaded_generation = 0;
Oid loaded_schema = InvalidOid;
bool changed_here = false;  // this transaction wrote the catalog
bool bump_at_commit = false;

// paused is read through to_jsonb: a 0.1.0 schema (before ALTER EXTENSION
// relaybus UPDATE) has no such column, and then no handler is paused.
SavedPlan handlers_plan = {
    "SELECT id, name, kind, (options || CASE WHEN secrets IS NULL THEN '{}'::jsonb "
    "ELSE jsonb_build_object('secret', to_jsonb(secrets)) END)::text, target, "
    "coalesce((to_jsonb(h) ->> 'paused')::boolean, false) FROM relay.handlers h",
    0,
    {},
    nullptr};
SavedPlan routes_plan = {"SELECT pattern, handler_id, wire_name FROM relay.routes", 0, {}, nullptr};

char* copy_text_col(int row, int col) {
  char* s = SPI_getvalue(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col);
  if (s == nullptr) return nullptr;
  char* out = static_cast<char*>(SPI_palloc(strlen(s) + 1));
  strcpy(out, s);
  return out;
}

void reload(Oid schema, uint64 generation) {
  SpiScope scope;
  spi_begin(&scope);
  spi_exec_latest(&handlers_plan, nullptr, nullptr, true, 0);
  int nh = static_cast<int>(SPI_processed);
  auto* hs = static_cast<CatalogHandlerRow*>(SPI_palloc(sizeof(CatalogHandlerRow) * (nh + 1)));
  for (int i = 0; i < nh; i++) {
    bool isnull = false;
    hs[i].id = DatumGetInt32(spi_col(i, 1, &isnull));
    hs[i].name = copy_text_col(i, 2);
    hs[i].kind = copy_text_col(i, 3);
    hs[i].options = copy_text_col(i, 4);
    hs[i].target = copy_text_col(i, 5);
    hs[i].paused = DatumGetBool(spi_col(i, 6, &isnull));
  }
  spi_exec_latest(&routes_plan, nullptr, nullptr, true, 0);
  int nr = static_cast<int>(SPI_processed);
  auto* rs = static_cast<CatalogRouteRow*>(SPI_palloc(sizeof(CatalogRouteRow) * (nr + 1)));
  for (int i = 0; i < nr; i++) {
    bool isnull = false;
    rs[i].pattern = copy_text_col(i, 1);
    rs[i].handler_id = DatumGetInt32(spi_col(i, 2, &isnull));
    rs[i].wire = copy_text_col(i, 3);
  }
  spi_end(&scope);
  // webhook-id = this prefix + the delivery id: unique across clusters (the
  // system identifier) and across databases in one (the oid), the same on
  // every retry (docs/webhooks.md).
  char message_id_prefix[64];
  snprintf(message_id_prefix, sizeof(message_id_prefix), "msg_" UINT64_FORMAT "_%u_", GetSystemIdentifier(),
           MyDatabaseId);

  Catalog* built = nullptr;
  ErrorRecord err;
  const char* database_name = get_database_name(MyDatabaseId);
  if (!catalog_build(hs, nh, rs, nr, message_id_prefix, database_name ? database_name : "", &built, &err))
    raise_error_in("relaybus could not load its catalog", &err);
  catalog_free(current);
  current = built;
  loaded_generation = generation;
  loaded_schema = schema;
}

void ensure_fresh() {
  if (shared == nullptr)
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("relaybus is not loaded through shared_preload_libraries"),
                    errhint("Add relaybus to shared_preload_libraries and restart the server.")));
  uint64 generation = pg_atomic_read_u64(&shared->catalog_generation);
  Oid schema = get_namespace_oid("relay", true);
  if (current != nullptr && !changed_here && generation == loaded_generation && schema == loaded_schema) return;
  reload(schema, generation);
}

}  // namespace

const HandlerEntry* catalog_handler_by_name(const char* name) {
  ensure_fresh();
  return catalog_find_name(current, name);
}

const char* catalog_handler_name_loaded(int32 id) {
  if (current == nullptr) return nullptr;
  const HandlerEntry* h = catalog_find_id(current, id);
  return h == nullptr ? nullptr : h->name;
}

const HandlerEntry* catalog_handler_by_id(int32 id) {
  ensure_fresh();
  return catalog_find_id(current, id);
}

int catalog_handler_count() {
  ensure_fresh();
  return catalog_size(current);
}

const HandlerEntry* catalog_handler_at(int i) { return catalog_entry(current, i); }

int catalog_routes_for(const char* topic, const RouteTarget** targets) {
  ensure_fresh();
  int n = 0;
  ErrorRecord err;
  if (!catalog_route(current, topic, targets, &n, &err)) raise_error_in("relaybus routing failed", &err);
  return n;
}

void catalog_changed_in_this_transaction() {
  changed_here = true;
  bump_at_commit = true;
}

void catalog_at_xact_end(bool commit) {
  if (bump_at_commit && commit && shared != nullptr) pg_atomic_fetch_add_u64(&shared->catalog_generation, 1);
  // After a rollback the cache may hold this transaction's uncommitted view.
  if (changed_here) loaded_generation = 0;
  changed_here = false;
  bump_at_commit = false;
}

}  // namespace relaybus::pg
