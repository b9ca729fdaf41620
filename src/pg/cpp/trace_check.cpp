#include "pg/cpp/trace_check.h"

#include <cstring>
#include <string>
#include <string_view>

#include "core/trace_context.hpp"

namespace relaybus::pg {

namespace {

void copy_out(const std::string& s, char* out, size_t size) {
  if (size == 0) return;
  const size_t n = s.size() < size - 1 ? s.size() : size - 1;
  std::memcpy(out, s.data(), n);
  out[n] = '\0';
}

}  // namespace

bool trace_traceparent_ok(const char* value, size_t len) noexcept {
  return core::valid_traceparent(std::string_view(value, len));
}

bool trace_tracestate_ok(const char* value, size_t len) noexcept {
  return core::valid_tracestate(std::string_view(value, len));
}

bool trace_from_sqlcommenter(const char* statement, size_t len, char* traceparent, size_t traceparent_size,
                             char* tracestate, size_t tracestate_size) noexcept {
  try {
    const core::TraceContext tc = core::sqlcommenter_trace_context(std::string_view(statement, len));
    if (!tc.present()) return false;
    copy_out(tc.traceparent, traceparent, traceparent_size);
    copy_out(tc.tracestate, tracestate, tracestate_size);
    return true;
  } catch (...) {
    return false;
  }
}

bool trace_attempt_traceparent(const char* stored, size_t len, uint64_t random64, char* out) noexcept {
  try {
    const std::string_view s(stored, len);
    if (!core::valid_traceparent(s)) return false;
    copy_out(core::attempt_traceparent(s, random64), out, kAttemptTraceparentSize);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace relaybus::pg
