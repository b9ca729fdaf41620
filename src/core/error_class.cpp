#include "error_class.hpp"

namespace relaybus::core {

namespace {

// PostgreSQL's message when the NOTIFY queue (pg_notify/, 8 GB) is full.
constexpr std::string_view kNotifyQueueFull = "too many notifications in the NOTIFY queue";

bool is_sqlstate(std::string_view s) noexcept {
  if (s.size() != 5) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z'))) return false;
  return true;
}

}  // namespace

ErrorCause classify_error(std::string_view sqlstate, std::string_view message) noexcept {
  if (!is_sqlstate(sqlstate)) return ErrorCause::Unknown;
  const std::string_view cls = sqlstate.substr(0, 2);
  if (cls == "54") {
    return message.find(kNotifyQueueFull) != std::string_view::npos ? ErrorCause::Environment : ErrorCause::Delivery;
  }
  // Data: invalid values, constraint violations, a subquery's cardinality.
  if (cls == "21" || cls == "22" || cls == "23") return ErrorCause::Delivery;
  // Environment. relaybus's statements are fixed, so a syntax or access rule
  // error (42) or a missing schema or database (3F, 3D) means the catalog or
  // privileges changed under the worker, not that a delivery is bad.
  static constexpr std::string_view kEnvironment[] = {
      "08",  // connection exception
      "25",  // invalid transaction state: read-only transaction, idle timeout
      "3D", "3F",
      "40",  // transaction rollback: serialization failure, deadlock
      "42",
      "53",  // insufficient resources: disk full, out of memory, too many connections
      "55",  // object not in prerequisite state: lock_timeout, object in use
      "57",  // operator intervention: statement_timeout, cancel, shutdown
      "58",  // system error: I/O
      "72",  // snapshot too old
      "F0",  // configuration file error
  };
  for (std::string_view env : kEnvironment)
    if (cls == env) return ErrorCause::Environment;
  return ErrorCause::Unknown;
}

const char* error_cause_name(ErrorCause cause) noexcept {
  switch (cause) {
    case ErrorCause::Delivery:
      return "delivery";
    case ErrorCause::Environment:
      return "environment";
    case ErrorCause::Unknown:
      break;
  }
  return "unknown";
}

}  // namespace relaybus::core
