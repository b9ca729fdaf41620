// Backend-local cache of handlers and routes.
//
// Publishing must not read relay.handlers and relay.routes on every call. The
// cache is rebuilt when the shared catalog generation moves (bumped at the
// commit of any change to those tables, by a statement trigger, which also
// wakes the dispatchers at that commit), when this
// backend changed them itself, or when the relay schema was recreated.
#pragma once

#include "pg/cpp/catalog_cache.h"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

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
