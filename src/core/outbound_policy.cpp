#include "outbound_policy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "text_util.hpp"

namespace relaybus::core {

namespace {

using text::set_why;

constexpr size_t kMaxHostBytes = 253;

// An address in canonical form: IPv4 as 4 bytes, IPv6 as 16.
struct Addr {
  int family = 0;
  unsigned char b[16] = {};
};

bool to_addr(const sockaddr* sa, socklen_t len, Addr* out) {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    sockaddr_in sin;
    std::memcpy(&sin, sa, sizeof sin);
    out->family = AF_INET;
    std::memcpy(out->b, &sin.sin_addr, 4);
    return true;
  }
  if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    sockaddr_in6 sin6;
    std::memcpy(&sin6, sa, sizeof sin6);
    out->family = AF_INET6;
    std::memcpy(out->b, &sin6.sin6_addr, 16);
    return true;
  }
  return false;
}

bool prefix_match(const unsigned char* a, const unsigned char* net, int prefix) {
  int full = prefix / 8;
  if (std::memcmp(a, net, static_cast<size_t>(full)) != 0) return false;
  int rest = prefix % 8;
  if (rest == 0) return true;
  unsigned char mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[full] & mask) == (net[full] & mask);
}

bool in4(const Addr& a, unsigned char b0, unsigned char b1, unsigned char b2, unsigned char b3, int prefix) {
  const unsigned char net[4] = {b0, b1, b2, b3};
  return prefix_match(a.b, net, prefix);
}

bool all_zero(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// The IPv4 address an IPv6 address embeds, for the forms that reach (or are
// meant to reach) an IPv4 host: mapped ::ffff:0:0/96, translated
// ::ffff:0:0:0/96, compatible ::/96 (not :: and ::1), NAT64 64:ff9b::/96,
// 6to4 2002::/16.
bool embedded_v4(const Addr& a6, Addr* v4) {
  const unsigned char* b = a6.b;
  auto take = [&](int at) {
    v4->family = AF_INET;
    std::memcpy(v4->b, b + at, 4);
    return true;
  };
  if (all_zero(b, 10) && b[10] == 0xff && b[11] == 0xff) return take(12);                           // mapped
  if (all_zero(b, 8) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0) return take(12);  // SIIT translated
  if (all_zero(b, 12) && !(all_zero(b + 12, 3) && b[15] <= 1)) return take(12);                     // compatible
  static const unsigned char kNat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(b, kNat64, 12) == 0) return take(12);
  if (b[0] == 0x20 && b[1] == 0x02) return take(2);  // 6to4
  return false;
}

const char* kind_v4(const Addr& a) {
  if (all_zero(a.b, 4)) return "unspecified";
  if (in4(a, 0, 0, 0, 0, 8)) return "reserved";
  if (in4(a, 127, 0, 0, 0, 8)) return "loopback";
  if (in4(a, 10, 0, 0, 0, 8) || in4(a, 172, 16, 0, 0, 12) || in4(a, 192, 168, 0, 0, 16)) return "private";
  if (in4(a, 169, 254, 169, 254, 32)) return "cloud metadata";
  if (in4(a, 168, 63, 129, 16, 32)) return "cloud metadata";  // Azure WireServer
  if (in4(a, 169, 254, 0, 0, 16)) return "link-local";
  if (in4(a, 100, 64, 0, 0, 10)) return "shared address space (CGNAT)";
  if (in4(a, 192, 0, 0, 0, 24)) return "reserved";   // IETF protocol assignments
  if (in4(a, 198, 18, 0, 0, 15)) return "reserved";  // benchmarking
  if (in4(a, 224, 0, 0, 0, 4)) return "multicast";
  if (in4(a, 255, 255, 255, 255, 32)) return "broadcast";
  if (in4(a, 240, 0, 0, 0, 4)) return "reserved";
  return nullptr;
}

const char* kind_v6(const Addr& a) {
  const unsigned char* b = a.b;
  if (all_zero(b, 16)) return "unspecified";
  if (all_zero(b, 15) && b[15] == 1) return "loopback";
  Addr v4;
  if (embedded_v4(a, &v4)) return kind_v4(v4);
  static const unsigned char kEc2[16] = {0xfd, 0, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x54};
  if (std::memcmp(b, kEc2, 16) == 0) return "cloud metadata";
  if ((b[0] & 0xfe) == 0xfc) return "private";                     // fc00::/7
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return "link-local";  // fe80::/10
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return "private";     // fec0::/10 site-local
  if (b[0] == 0xff) return "multicast";                            // ff00::/8
  static const unsigned char kNat64Local[6] = {0, 0x64, 0xff, 0x9b, 0, 0x01};
  if (std::memcmp(b, kNat64Local, 6) == 0) return "private";  // 64:ff9b:1::/48
  static const unsigned char kDiscard[8] = {0x01, 0, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(b, kDiscard, 8) == 0) return "reserved";  // 100::/64
  return nullptr;
}

const char* kind_of(const Addr& a) { return a.family == AF_INET ? kind_v4(a) : kind_v6(a); }

bool cidr_contains(const Cidr& c, const Addr& a) { return c.family == a.family && prefix_match(a.b, c.addr, c.prefix); }

std::string normalize_host(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  return text::ascii_lower(host);
}

std::string addr_text(const Addr& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(a.family, a.b, buf, sizeof buf) == nullptr) return "?";
  return buf;
}

bool parse_prefix(std::string_view s, int max, int* out) {
  if (s.empty() || s.size() > 3) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  *out = v;
  return true;
}

// An address entry, "/prefix" optional; the IPv6 part may be bracketed.
// Returns 1 parsed, 0 not an address at all (maybe a host name), -1 an
// address-looking entry that is invalid.
int parse_cidr(std::string_view entry, Cidr* out, std::string* why) {
  std::string_view addr = entry, prefix;
  bool has_prefix = false;
  const size_t slash = entry.find('/');
  if (slash != std::string_view::npos) {
    addr = entry.substr(0, slash);
    prefix = entry.substr(slash + 1);
    has_prefix = true;
  }
  bool bracketed = false;
  if (addr.size() >= 2 && addr.front() == '[' && addr.back() == ']') {
    addr = addr.substr(1, addr.size() - 2);
    bracketed = true;
  }
  const bool looks_v6 = addr.find(':') != std::string_view::npos;
  bool looks_v4 = !addr.empty() && !looks_v6;
  for (char c : addr) looks_v4 = looks_v4 && ((c >= '0' && c <= '9') || c == '.');
  if (!looks_v6 && !looks_v4) {
    if (has_prefix || bracketed) {
      set_why(why, "http allow-list entry " + text::quote(entry) + " is not a valid CIDR");
      return -1;
    }
    return 0;
  }
  const std::string a(addr);
  Addr parsed;
  if (looks_v4 && !bracketed && inet_pton(AF_INET, a.c_str(), parsed.b) == 1) {
    parsed.family = AF_INET;
  } else if (looks_v6 && inet_pton(AF_INET6, a.c_str(), parsed.b) == 1) {
    parsed.family = AF_INET6;
  } else {
    set_why(why, "http allow-list entry " + text::quote(entry) + " is not a valid IP address");
    return -1;
  }
  const int max = parsed.family == AF_INET ? 32 : 128;
  int bits = max;
  if (has_prefix && !parse_prefix(prefix, max, &bits)) {
    set_why(why, "http allow-list entry " + text::quote(entry) + " has an invalid prefix length (0.." +
                     std::to_string(max) + ")");
    return -1;
  }
  // ::ffff:a.b.c.d/96+n is the IPv4 network a.b.c.d/n.
  if (parsed.family == AF_INET6 && bits >= 96 && all_zero(parsed.b, 10) && parsed.b[10] == 0xff &&
      parsed.b[11] == 0xff) {
    parsed.family = AF_INET;
    std::memmove(parsed.b, parsed.b + 12, 4);
    std::memset(parsed.b + 4, 0, 12);
    bits -= 96;
  }
  Cidr c;
  c.family = parsed.family;
  c.prefix = bits;
  const int nbytes = parsed.family == AF_INET ? 4 : 16;
  for (int i = 0; i < nbytes; ++i) {
    const int keep = bits - i * 8;
    unsigned char mask = keep >= 8 ? 0xff : keep <= 0 ? 0 : static_cast<unsigned char>(0xff << (8 - keep));
    c.addr[i] = parsed.b[i] & mask;
  }
  *out = c;
  return 1;
}

bool valid_host_name(std::string_view h) {
  if (h.empty() || h.size() > kMaxHostBytes) return false;
  for (char c : h) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return h.front() != '.';
}

}  // namespace

bool parse_allowlist(std::string_view csv, Allowlist* out, std::string* why) {
  Allowlist result;
  size_t pos = 0;
  while (pos <= csv.size()) {
    size_t comma = csv.find(',', pos);
    if (comma == std::string_view::npos) comma = csv.size();
    const std::string_view entry = text::trim(csv.substr(pos, comma - pos));
    pos = comma + 1;
    if (entry.empty()) continue;
    Cidr c;
    const int r = parse_cidr(entry, &c, why);
    if (r < 0) return false;
    if (r > 0) {
      result.cidrs.push_back(c);
      continue;
    }
    std::string_view h = entry;
    if (h.back() == '.') h.remove_suffix(1);
    if (!valid_host_name(h)) {
      set_why(why, "http allow-list entry " + text::quote(entry) + " is neither an IP address, a CIDR nor a host name");
      return false;
    }
    result.hosts.push_back(text::ascii_lower(h));
  }
  *out = std::move(result);
  return true;
}

const char* restricted_address_kind(const sockaddr* addr, socklen_t len) {
  Addr a;
  if (!to_addr(addr, len, &a)) return "unsupported address family";
  return kind_of(a);
}

std::string address_text(const sockaddr* addr, socklen_t len) {
  Addr a;
  if (!to_addr(addr, len, &a)) return "?";
  return addr_text(a);
}

bool address_allowed(const sockaddr* addr, socklen_t len, std::string_view host, const Allowlist& allow,
                     std::string* why) {
  Addr a;
  if (!to_addr(addr, len, &a)) {
    set_why(why,
            "address family " + std::to_string(addr ? addr->sa_family : -1) + " is not allowed (only IPv4 and IPv6)");
    return false;
  }
  const char* kind = kind_of(a);
  if (kind == nullptr) return true;

  const std::string h = normalize_host(host);
  if (!h.empty()) {
    for (const std::string& allowed : allow.hosts)
      if (allowed == h) return true;
  }
  Addr v4;
  const bool has_v4 = a.family == AF_INET6 && embedded_v4(a, &v4);
  for (const Cidr& c : allow.cidrs) {
    if (cidr_contains(c, a)) return true;
    if (has_v4 && cidr_contains(c, v4)) return true;
  }
  if (why != nullptr) {
    const std::string text = addr_text(a);
    std::string msg = "address " + text + " is not allowed (" + kind + ")";
    if (!h.empty() && h != text)
      msg += " for host " + text::quote(h, 100) + ": add the host or the address to the http allow-list to permit it";
    else
      msg += ": add it to the http allow-list to permit it";
    *why = std::move(msg);
  }
  return false;
}

}  // namespace relaybus::core
