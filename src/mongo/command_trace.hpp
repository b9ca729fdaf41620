// Store command tracing through libmongoc's APM callbacks: at log level debug
// every command the client sends is logged with its duration; a command
// slower than a second is logged at warn at any level (a slow find on a deep
// backlog blocks the loop, so it is the first thing to look for when leases
// or deliveries stall).
#pragma once

#include <mongoc/mongoc.h>

namespace relaybus::mongo {

void install_command_trace(mongoc_client_t* client);

}  // namespace relaybus::mongo
