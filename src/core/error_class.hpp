#pragma once

// What caused an error that aborted a dispatcher's iteration: the data of a
// delivery in flight, or its environment. Only the first may count against a
// delivery's attempts (guarantee 9: errors are charged to their cause).

#include <string_view>

namespace relaybus::core {

enum class ErrorCause {
  // A delivery's own data (SQLSTATE classes 21, 22, 23, 54 but a full NOTIFY
  // queue): isolate the delivery that causes it and nack it.
  Delivery,
  // The server, the session, concurrency or an operator (classes 08, 25, 3D,
  // 3F, 40, 42, 53, 55, 57, 58, 72, F0, and a full NOTIFY queue): retry the
  // iteration after a backoff; no delivery's attempts change.
  Environment,
  // Anything else (XX000, a trigger's P0001, ...): isolated like Delivery, so
  // that a poison delivery can never stall a dispatcher for ever.
  Unknown,
};

// The cause of an error from its five-character SQLSTATE and its primary
// message (needed where PostgreSQL shares one SQLSTATE between causes: 54000
// is both "too many notifications in the NOTIFY queue" and a payload too big).
ErrorCause classify_error(std::string_view sqlstate, std::string_view message) noexcept;

// "delivery", "environment" or "unknown": for logs and views.
const char* error_cause_name(ErrorCause cause) noexcept;

}  // namespace relaybus::core
