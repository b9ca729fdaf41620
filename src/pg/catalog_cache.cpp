#include "pg/catalog_cache.hpp"

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/route_resolver.hpp"
#include "pg/guard.hpp"
#include "pg/shared_state.hpp"
#include "pg/spi_support.hpp"

extern "C" {
#include "access/xlog.h"
#include "miscadmin.h"
}

namespace relaybus::pg {

namespace {

struct Catalog {
  std::vector<HandlerEntry> handlers;
  std::unordered_map<std::string, size_t> by_name;
  std::unordered_map<int32, size_t> by_id;
  core::RouteResolver routes;                                          // keyed by handler id
  std::unordered_map<std::string, std::vector<RouteTarget>> by_topic;  // memo
  std::vector<core::RouteResolver::Decision> scratch;                  // a memo miss's decisions, reused
};

constexpr size_t kMaxMemoTopics = 4096;

Catalog* current = nullptr;
uint64 loaded_generation = 0;
Oid loaded_schema = InvalidOid;
bool changed_here = false;  // this transaction wrote the catalog
bool bump_at_commit = false;

// Rows as read by SPI, copied out as plain C strings.
struct RawHandler {
  int32 id;
  char* name;
  char* kind;
  char* options;
  char* target;
  bool paused;
};
struct RawRoute {
  char* pattern;
  int32 handler_id;
  char* wire;  // may be nullptr
};

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
  auto* hs = static_cast<RawHandler*>(SPI_palloc(sizeof(RawHandler) * (nh + 1)));
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
  auto* rs = static_cast<RawRoute*>(SPI_palloc(sizeof(RawRoute) * (nr + 1)));
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
  char err[kErrLen];
  bool ok = run_core(
      [&](std::string* why) {
        auto cat = std::make_unique<Catalog>();
        cat->handlers.reserve(nh);
        for (int i = 0; i < nh; i++) {
          HandlerEntry h{};
          h.id = hs[i].id;
          h.paused = hs[i].paused;
          strlcpy(h.name, hs[i].name, sizeof(h.name));
          if (hs[i].target != nullptr) {
            strlcpy(h.channel, hs[i].target, sizeof(h.channel));
            h.target = hs[i].target;
          }
          if (!core::parse_handler_kind(hs[i].kind, &h.kind, why)) return false;
          // Stored options were validated on the way in; a failure here means
          // the row was written by hand, and defaults are the safe reading.
          std::string ignored;
          if (!core::parse_handler_options(h.kind, hs[i].options, &h.options, &ignored))
            h.options = core::HandlerOptions{};
          h.options.message_id_prefix = message_id_prefix;
          cat->by_name.emplace(h.name, cat->handlers.size());
          cat->by_id.emplace(h.id, cat->handlers.size());
          cat->handlers.push_back(std::move(h));
        }
        std::vector<core::RouteInput> routes;
        routes.reserve(nr);
        for (int i = 0; i < nr; i++) {
          core::RouteInput r;
          r.handler = rs[i].handler_id;
          r.pattern = rs[i].pattern;
          if (rs[i].wire != nullptr) r.wire_name = rs[i].wire;
          routes.push_back(std::move(r));
        }
        cat->routes = core::RouteResolver(std::move(routes));
        delete current;
        current = cat.release();
        built = current;
        return true;
      },
      err);
  if (!ok || built == nullptr)
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relaybus could not load its catalog: %s", err)));
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
  auto it = current->by_name.find(name);
  return it == current->by_name.end() ? nullptr : &current->handlers[it->second];
}

const char* catalog_handler_name_loaded(int32 id) {
  if (current == nullptr) return nullptr;
  auto it = current->by_id.find(id);
  return it == current->by_id.end() ? nullptr : current->handlers[it->second].name;
}

const HandlerEntry* catalog_handler_by_id(int32 id) {
  ensure_fresh();
  auto it = current->by_id.find(id);
  return it == current->by_id.end() ? nullptr : &current->handlers[it->second];
}

int catalog_handler_count() {
  ensure_fresh();
  return static_cast<int>(current->handlers.size());
}

const HandlerEntry* catalog_handler_at(int i) { return &current->handlers[i]; }

int catalog_routes_for(const char* topic, const RouteTarget** targets) {
  ensure_fresh();
  const std::vector<RouteTarget>* found = nullptr;
  char err[kErrLen];
  bool ok = run_core(
      [&](std::string*) {
        Catalog* cat = current;
        auto it = cat->by_topic.find(topic);
        if (it == cat->by_topic.end()) {
          // In handler id order, as deliveries are inserted (core::RouteResolver
          // decides per handler).
          cat->scratch.clear();
          cat->routes.resolve(topic, &cat->scratch);
          std::vector<RouteTarget> out;
          out.reserve(cat->scratch.size());
          for (const auto& d : cat->scratch) {
            const auto hid = static_cast<int32>(d.handler);
            auto h = cat->by_id.find(hid);
            bool by_workers = h != cat->by_id.end() && cat->handlers[h->second].kind != core::HandlerKind::Pull;
            const auto& wire = d.route->wire_name;
            out.push_back(RouteTarget{hid, wire ? wire->c_str() : nullptr, by_workers});
          }
          if (cat->by_topic.size() >= kMaxMemoTopics) cat->by_topic.clear();
          it = cat->by_topic.emplace(topic, std::move(out)).first;
        }
        found = &it->second;
        return true;
      },
      err);
  if (!ok) ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relaybus routing failed: %s", err)));
  *targets = found->empty() ? nullptr : found->data();
  return static_cast<int>(found->size());
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
