// The catalog of handlers and routes a backend holds, in plain C types,
// between its glue (catalog_cache.cpp: when to reload, the SPI reads) and its
// C++ half (cpp/catalog_cache.cpp: the parsed handlers, the lookups, the route
// resolver and its memo).
#pragma once

#include <cstdint>

#include "core/handler_kind.hpp"
#include "pg/cpp/boundary.h"

namespace relaybus::pg {

constexpr int kNameLen = 64;  // NAMEDATALEN (catalog_cache.cpp checks)

// The target as stored and the parsed options (C++: cpp/handler_config.hpp).
struct HandlerConfig;

struct HandlerEntry {
  int32_t id;
  char name[kNameLen];
  core::HandlerKind kind;
  char channel[kNameLen];  // notify handlers: the LISTEN channel
  bool paused;             // relay_pause_handler: delivery waits, publishing goes on
  // The options glue reads; every option is in config.
  bool ack;             // notify: consumers ack
  bool inline_payload;  // notify: the payload inline, else by reference
  int64_t lease_ms;
  int64_t timeout_ms;  // http: a request's timeout
  int key_window;      // kafka: deliveries of a key claimed and in flight at once
  const HandlerConfig* config;
};

struct RouteTarget {
  int32_t handler_id;
  const char* wire_name;  // nullptr: the handler sees the topic itself
  bool by_workers;        // a notify or http handler (delivered by the dispatchers)
};

// Rows as read by SPI (target, wire: nullptr when NULL).
struct CatalogHandlerRow {
  int32_t id;
  const char* name;
  const char* kind;
  const char* options;
  const char* target;
  bool paused;
};
struct CatalogRouteRow {
  const char* pattern;
  int32_t handler_id;
  const char* wire;
};

struct Catalog;  // opaque

// message_id_prefix: the webhook-id prefix of this cluster and database;
// database_name: this database's, for the default CloudEvents source.
bool catalog_build(const CatalogHandlerRow* handlers, int nhandlers, const CatalogRouteRow* routes, int nroutes,
                   const char* message_id_prefix, const char* database_name, Catalog** out, ErrorRecord* err) noexcept;
void catalog_free(Catalog* cat) noexcept;
// nullptr if none; pointers stay valid until catalog_free().
const HandlerEntry* catalog_find_name(const Catalog* cat, const char* name) noexcept;
const HandlerEntry* catalog_find_id(const Catalog* cat, int32_t id) noexcept;
int catalog_size(const Catalog* cat) noexcept;
const HandlerEntry* catalog_entry(const Catalog* cat, int i) noexcept;
// The handlers a topic routes to, in handler id order (*targets valid until
// the next call).
bool catalog_route(Catalog* cat, const char* topic, const RouteTarget** targets, int* ntargets,
                   ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
