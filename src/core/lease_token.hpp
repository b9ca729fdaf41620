#pragma once

// A PostgreSQL lease token (uuid) as the 16 bytes a delivery's Receipt
// carries, and back: relaybus-agent fences every completion with it.

#include <cstdint>
#include <string>
#include <string_view>

namespace relaybus::core {

// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (hex digits of either case, the
// form uuid's output has): hi = its first 8 bytes, lo = the last 8. False for
// anything else; *hi and *lo are then unchanged.
bool parse_lease_token(std::string_view text, uint64_t* hi, uint64_t* lo);
// The same text, lower case.
std::string format_lease_token(uint64_t hi, uint64_t lo);

// How long an agent leases an http delivery: the handler's lease, but at
// least its request timeout plus twice margin_ms (one margin for the queue,
// one for settling), so that a request that waited in the queue and ran to its
// timeout still ends before its lease; at most a day (the longest lease).
int64_t http_lease_ms(int64_t lease_ms, int64_t timeout_ms, int64_t margin_ms);
// How long a claimed delivery may wait in the agent's queue before it is
// given back unsent: what is left of its lease once its request could take
// the whole timeout and the margin (at least margin_ms for a lease from
// http_lease_ms); at least 0.
int64_t http_queue_ms(int64_t leased_ms, int64_t timeout_ms, int64_t margin_ms);

}  // namespace relaybus::core
