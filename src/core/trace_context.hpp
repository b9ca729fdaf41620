#pragma once

// W3C Trace Context (level 1) through the bus: the publisher's traceparent
// and tracestate are kept in the event's headers (keys "traceparent" and
// "tracestate"), and every delivery attempt carries them onward as a new span
// of the same trace. One validator and one per-attempt rule for the
// extension, the managed edition's agent and relaybus-mongo, so that every
// edition accepts, drops and rewrites the same values. docs/tracing.md.

#include <cstdint>
#include <string>
#include <string_view>

namespace relaybus::core {

constexpr size_t kTraceparentLen = 55;  // "00-" 32 hex "-" 16 hex "-" 2 hex
constexpr size_t kTracestateMaxLen = 512;
constexpr int kTracestateMaxMembers = 32;

// version "-" trace-id "-" parent-id "-" flags, lower-case hex: version not
// ff, exactly 55 characters for 00 (a later version may append "-..."), the
// trace-id and parent-id not all zeros.
bool valid_traceparent(std::string_view value);

// At most 512 characters and 32 list-members, each key=value by the
// grammar, no key twice (empty members between commas are allowed).
bool valid_tracestate(std::string_view value);

// 16 lower-case hex digits of random64; never all zeros (0 becomes 1).
std::string span_id_hex(uint64_t random64);

// The traceparent an attempt sends: version 00, the stored value's trace-id
// and flags, parent-id span_id_hex(random64). `stored` must be valid.
std::string attempt_traceparent(std::string_view stored, uint64_t random64);

// The trace context kept with an event.
struct TraceContext {
  std::string traceparent;  // empty: none
  std::string tracestate;   // empty: none (never without a traceparent)
  bool present() const { return !traceparent.empty(); }
};

// From an event's headers (JSON text): the "traceparent" string if valid, and
// "tracestate" with it if valid. An event without the key pays a substring
// search, no JSON parse.
TraceContext trace_context_from_headers(std::string_view headers_json);

// A sqlcommenter comment (a closed /* */) in the last 4 kB of a statement:
// traceparent='...' (and tracestate='...', the last of each), values URL-decoded. Returns what it found, unchecked
// (the caller validates); never throws on any input.
constexpr size_t kSqlcommenterScanBytes = 4096;
TraceContext sqlcommenter_trace_context(std::string_view statement);

}  // namespace relaybus::core
