// Backend-local cache of handlers and routes.
//
// Publishing must not read relay.handlers and relay.routes on every call. The
// cache is rebuilt when the shared catalog generation moves (bumped at the
// commit of any change to those tables, by a statement trigger, which also
// wakes the dispatchers at that commit), when this
// backend changed them itself, or when the relay schema was recreated.
#pragma once

#include <string>

#include "core/handler_config.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

struct HandlerEntry {
  int32 id;
  char name[NAMEDATALEN];
  core::HandlerKind kind;
  char channel[NAMEDATALEN];  // notify handlers: the LISTEN channel
  std::string target;         // the target as stored (the URL of an http handler)
  core::HandlerOptions options;
  bool paused;  // relay_pause_handler: delivery waits, publishing goes on
};

struct RouteTarget {
  int32 handler_id;
  const char* wire_name;  // nullptr: the handler sees the topic itself
  bool by_workers;        // a notify or http handler (delivered by the dispatchers)
};

// Pointers stay valid until the next call of any catalog_* function.
const HandlerEntry* catalog_handler_by_name(const char* name);
const HandlerEntry* catalog_handler_by_id(int32 id);
// The name of handler `id` in the catalog this process has loaded, without
// loading it again (no SPI: callable between statements), or nullptr.
const char* catalog_handler_name_loaded(int32 id);
int catalog_routes_for(const char* topic, const RouteTarget** targets);
int catalog_handler_count();
const HandlerEntry* catalog_handler_at(int i);  // after catalog_handler_count()

// Called by the statement trigger on relay.handlers and relay.routes.
void catalog_changed_in_this_transaction();
void catalog_at_xact_end(bool commit);

}  // namespace relaybus::pg
