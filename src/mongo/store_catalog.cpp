// Store calls of the handler catalog (store.hpp): relay_handlers and relay_routes.
#include "mongo/store.hpp"

#include "core/cloudevents.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

void Store::put_handler(const HandlerDoc& h) {
  Bson filter, doc, opts, reply;
  BSON_APPEND_UTF8(filter, "_id", h.name.c_str());
  BSON_APPEND_UTF8(doc, "_id", h.name.c_str());
  BSON_APPEND_UTF8(doc, "kind", core::handler_kind_name(h.kind));
  BSON_APPEND_UTF8(doc, "target", h.target.c_str());
  BSON_APPEND_UTF8(doc, "options", h.options_json.c_str());
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("replace");
  if (!mongoc_collection_replace_one(coll(kHandlers), filter, doc, opts, reply, &err))
    raise_store_error("store handler", err);
}

bool Store::insert_handler(const HandlerDoc& h) {
  Bson doc;
  BSON_APPEND_UTF8(doc, "_id", h.name.c_str());
  BSON_APPEND_UTF8(doc, "kind", core::handler_kind_name(h.kind));
  BSON_APPEND_UTF8(doc, "target", h.target.c_str());
  BSON_APPEND_UTF8(doc, "options", h.options_json.c_str());
  return insert_new(kHandlers, doc, "create handler");
}

bool Store::drop_handler(const std::string& name) {
  const int64_t n = delete_id(kHandlers, name, "drop handler");
  Bson rf, rr;
  bson_error_t err;
  BSON_APPEND_UTF8(rf, "handler", name.c_str());
  const auto second_command = count("delete");
  if (!mongoc_collection_delete_many(coll(kRoutes), rf, nullptr, rr, &err)) raise_store_error("drop routes", err);
  return n > 0;
}

std::vector<HandlerDoc> Store::load_handlers(std::vector<std::string>* bad) {
  std::vector<HandlerDoc> out;
  each_in(kHandlers, "read handlers", [&](const bson_t* doc) {
    HandlerDoc h;
    std::string kind, why;
    if (!get_string(doc, "_id", &h.name) || !get_string(doc, "kind", &kind) || !get_string(doc, "target", &h.target)) {
      if (bad) bad->push_back(h.name + ": _id, kind and target must be strings");
      return;
    }
    get_string(doc, "options", &h.options_json);
    if (!core::parse_handler_kind(kind, &h.kind, &why) || !core::validate_target(h.kind, h.target, false, &why) ||
        !core::parse_handler_options(h.kind, h.options_json, &h.options, &why)) {
      if (bad) bad->push_back(h.name + ": " + why);
      return;
    }
    // webhook-id = this prefix + the delivery id (docs/mongo.md): never equal to
    // a PostgreSQL database's ("msg_<system id>_<oid>_"), the same on every retry.
    h.options.message_id_prefix = "msg_mongo_" + db_ + "_";
    h.options.default_cloudevents_source = core::default_cloudevents_source("/relaybus-mongo/", db_);
    out.push_back(std::move(h));
  });
  return out;
}

void Store::put_route(const RouteDoc& r) {
  Bson filter, doc, opts, reply;
  std::string id = r.handler + "|" + r.pattern;
  BSON_APPEND_UTF8(filter, "_id", id.c_str());
  BSON_APPEND_UTF8(doc, "_id", id.c_str());
  BSON_APPEND_UTF8(doc, "pattern", r.pattern.c_str());
  BSON_APPEND_UTF8(doc, "handler", r.handler.c_str());
  if (!r.wire_name.empty()) BSON_APPEND_UTF8(doc, "wire_name", r.wire_name.c_str());
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("replace");
  if (!mongoc_collection_replace_one(coll(kRoutes), filter, doc, opts, reply, &err))
    raise_store_error("store route", err);
}

bool Store::drop_route(const std::string& pattern, const std::string& handler) {
  return delete_id(kRoutes, handler + "|" + pattern, "drop route") > 0;
}

std::vector<RouteDoc> Store::load_routes() {
  std::vector<RouteDoc> out;
  each_in(kRoutes, "read routes", [&](const bson_t* doc) {
    RouteDoc r;
    if (!get_string(doc, "pattern", &r.pattern) || !get_string(doc, "handler", &r.handler)) return;
    get_string(doc, "wire_name", &r.wire_name);
    out.push_back(std::move(r));
  });
  return out;
}

}  // namespace relaybus::mongo
