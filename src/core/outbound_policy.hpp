#pragma once

// Outbound safety of HTTP callouts: which addresses a delivery may connect to.
// The check runs on the address actually connected to (the HTTP engine calls
// it from libcurl's open-socket callback), so a name that resolves, or later
// re-resolves, to an internal address cannot get around it.

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace relaybus::core {

struct Cidr {
  int family = 0;               // AF_INET or AF_INET6
  unsigned char addr[16] = {};  // network address, host bits cleared (4 bytes for AF_INET)
  int prefix = 0;               // 0..32 or 0..128
};

// What the operator opened (relaybus.http_allowlist).
struct Allowlist {
  std::vector<std::string> hosts;  // lower case, no trailing dot, IPv6 brackets removed
  std::vector<Cidr> cidrs;
  bool empty() const { return hosts.empty() && cidrs.empty(); }
};

// Comma-separated entries, each trimmed of ASCII whitespace; empty entries
// are ignored (so "" is the empty list):
//   - an IPv4 or IPv6 address, optionally with "/prefix" ("10.1.2.3",
//     "127.0.0.0/8", "::1/128", "[fd00::1]"); host bits may be set
//     ("127.0.0.1/8" means 127.0.0.0/8). IPv4-mapped IPv6 entries
//     ("::ffff:10.0.0.0/104") are stored as the IPv4 network they denote.
//   - otherwise a host name, matched exactly and case-insensitively against
//     the host of the URL ("localhost", "hooks.internal"): letters, digits,
//     '-', '_' and '.', at most 253 bytes. No wildcards.
// *out is written only on success; *why names the bad entry otherwise.
bool parse_allowlist(std::string_view csv, Allowlist* out, std::string* why);

// Why an address is refused by default: "loopback", "private", "link-local",
// "multicast", "unspecified", "broadcast", "reserved", "shared address space
// (CGNAT)", "cloud metadata", or nullptr when it is a public address.
// IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64
// (64:ff9b::a.b.c.d) and 6to4 (2002:AABB:CCDD::) IPv6 forms are judged by
// the IPv4 address they embed. addr must be AF_INET or AF_INET6.
const char* restricted_address_kind(const sockaddr* addr, socklen_t len);

// True if a connection to addr may be opened for a request to `host` (the
// URL's host, with or without IPv6 brackets; may be empty): public addresses
// always; a restricted one only if the host or the address is in the
// allow-list. Families other than IPv4/IPv6 are refused. On refusal *why
// (when not null) reads like "address 127.0.0.1 (loopback) of host
// \"localhost\" is not allowed: add the host or the address to the http
// allow-list to permit it".
bool address_allowed(const sockaddr* addr, socklen_t len, std::string_view host, const Allowlist& allow,
                     std::string* why);

// Text form of an IPv4/IPv6 socket address (no port), "?" for other families.
std::string address_text(const sockaddr* addr, socklen_t len);

}  // namespace relaybus::core
