// A handler's kind, on its own (no STL): the PostgreSQL glue reads it.
#pragma once

namespace relaybus::core {

enum class HandlerKind { Notify, Http, Pull, Kafka };

// "notify" | "http" | "pull" | "kafka" (handler_config.cpp; parse_handler_kind reads it back).
const char* handler_kind_name(HandlerKind k) noexcept;

}  // namespace relaybus::core
