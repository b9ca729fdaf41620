// The core's W3C Trace Context rules for glue (C++, cpp/trace_check.cpp):
// plain buffers in and out, nothing thrown.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace relaybus::pg {

bool trace_traceparent_ok(const char* value, size_t len) noexcept;
bool trace_tracestate_ok(const char* value, size_t len) noexcept;

// A sqlcommenter comment in the last 4 kB of statement: its traceparent (and
// tracestate) values, URL-decoded and unchecked, NUL-terminated into the
// buffers (truncated to their size: a value that long is invalid anyway).
// False when there is no traceparent (or on any failure).
bool trace_from_sqlcommenter(const char* statement, size_t len, char* traceparent, size_t traceparent_size,
                             char* tracestate, size_t tracestate_size) noexcept;

// The traceparent of one attempt of a valid stored one: a new span id from
// random64 (core::attempt_traceparent) into out (56 bytes, NUL-terminated).
constexpr size_t kAttemptTraceparentSize = 56;
bool trace_attempt_traceparent(const char* stored, size_t len, uint64_t random64, char* out) noexcept;

}  // namespace relaybus::pg
