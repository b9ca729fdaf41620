#include "core/outbound_policy.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <cstring>
#include <string>

namespace relaybus::core {
namespace {

// A socket address from its text (IPv4 or IPv6).
struct Sock {
  sockaddr_storage ss{};
  socklen_t len = 0;
  explicit Sock(const std::string& text) {
    sockaddr_in sin{};
    sockaddr_in6 sin6{};
    if (inet_pton(AF_INET, text.c_str(), &sin.sin_addr) == 1) {
      sin.sin_family = AF_INET;
      sin.sin_port = htons(443);
      std::memcpy(&ss, &sin, sizeof sin);
      len = sizeof sin;
    } else if (inet_pton(AF_INET6, text.c_str(), &sin6.sin6_addr) == 1) {
      sin6.sin6_family = AF_INET6;
      sin6.sin6_port = htons(443);
      std::memcpy(&ss, &sin6, sizeof sin6);
      len = sizeof sin6;
    } else {
      ADD_FAILURE() << "bad test address " << text;
    }
  }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
};

std::string kind(const std::string& text) {
  Sock s(text);
  const char* k = restricted_address_kind(s.sa(), s.len);
  return k == nullptr ? "public" : k;
}

Allowlist parse(const std::string& csv) {
  Allowlist a;
  std::string why;
  EXPECT_TRUE(parse_allowlist(csv, &a, &why)) << csv << ": " << why;
  return a;
}

bool allowed(const std::string& addr, const std::string& host, const Allowlist& a, std::string* why = nullptr) {
  Sock s(addr);
  return address_allowed(s.sa(), s.len, host, a, why);
}

// ---- what is restricted -------------------------------------------------------

TEST(OutboundPolicy, IPv4Kinds) {
  EXPECT_EQ(kind("127.0.0.1"), "loopback");
  EXPECT_EQ(kind("127.255.255.254"), "loopback");
  EXPECT_EQ(kind("10.0.0.1"), "private");
  EXPECT_EQ(kind("10.255.255.255"), "private");
  EXPECT_EQ(kind("172.16.0.1"), "private");
  EXPECT_EQ(kind("172.31.255.255"), "private");
  EXPECT_EQ(kind("192.168.1.1"), "private");
  EXPECT_EQ(kind("169.254.1.1"), "link-local");
  EXPECT_EQ(kind("169.254.169.254"), "cloud metadata");
  EXPECT_EQ(kind("168.63.129.16"), "cloud metadata");
  EXPECT_EQ(kind("100.64.0.1"), "shared address space (CGNAT)");
  EXPECT_EQ(kind("100.127.255.255"), "shared address space (CGNAT)");
  EXPECT_EQ(kind("100.100.100.200"), "shared address space (CGNAT)");
  EXPECT_EQ(kind("224.0.0.1"), "multicast");
  EXPECT_EQ(kind("239.255.255.250"), "multicast");
  EXPECT_EQ(kind("0.0.0.0"), "unspecified");
  EXPECT_EQ(kind("0.1.2.3"), "reserved");
  EXPECT_EQ(kind("255.255.255.255"), "broadcast");
  EXPECT_EQ(kind("240.0.0.1"), "reserved");
  EXPECT_EQ(kind("192.0.0.192"), "reserved");
  EXPECT_EQ(kind("198.18.0.1"), "reserved");
  // Neighbours of the ranges are public.
  for (const char* pub :
       {"8.8.8.8", "1.1.1.1", "126.255.255.255", "128.0.0.1", "11.0.0.1", "172.15.255.255", "172.32.0.0",
        "192.167.255.255", "192.169.0.0", "169.253.255.255", "169.255.0.0", "100.63.255.255", "100.128.0.0",
        "223.255.255.255", "168.63.129.17", "198.20.0.0", "93.184.216.34"})
    EXPECT_EQ(kind(pub), "public") << pub;
}

TEST(OutboundPolicy, IPv6Kinds) {
  EXPECT_EQ(kind("::1"), "loopback");
  EXPECT_EQ(kind("::"), "unspecified");
  EXPECT_EQ(kind("fc00::1"), "private");
  EXPECT_EQ(kind("fd12:3456::1"), "private");
  EXPECT_EQ(kind("fd00:ec2::254"), "cloud metadata");
  EXPECT_EQ(kind("fe80::1"), "link-local");
  EXPECT_EQ(kind("febf::1"), "link-local");
  EXPECT_EQ(kind("fec0::1"), "private");
  EXPECT_EQ(kind("ff02::1"), "multicast");
  EXPECT_EQ(kind("64:ff9b:1::1"), "private");
  EXPECT_EQ(kind("100::1"), "reserved");
  for (const char* pub : {"2001:4860:4860::8888", "2606:4700:4700::1111", "fbff::1", "fe7f::1", "2001:db8::1",
                          "64:ff9b::808:808", "2002:808:808::1"})
    EXPECT_EQ(kind(pub), "public") << pub;
}

TEST(OutboundPolicy, IPv6FormsOfIPv4AreJudgedByTheEmbeddedAddress) {
  EXPECT_EQ(kind("::ffff:127.0.0.1"), "loopback");
  EXPECT_EQ(kind("::ffff:10.1.2.3"), "private");
  EXPECT_EQ(kind("::ffff:169.254.169.254"), "cloud metadata");
  EXPECT_EQ(kind("::ffff:0.0.0.0"), "unspecified");
  EXPECT_EQ(kind("::ffff:255.255.255.255"), "broadcast");
  EXPECT_EQ(kind("::ffff:224.0.0.1"), "multicast");
  EXPECT_EQ(kind("::ffff:100.64.0.1"), "shared address space (CGNAT)");
  EXPECT_EQ(kind("::ffff:8.8.8.8"), "public");
  EXPECT_EQ(kind("::ffff:0:127.0.0.1"), "loopback");  // SIIT
  EXPECT_EQ(kind("::127.0.0.1"), "loopback");         // IPv4-compatible
  EXPECT_EQ(kind("::10.0.0.1"), "private");
  EXPECT_EQ(kind("64:ff9b::127.0.0.1"), "loopback");  // NAT64
  EXPECT_EQ(kind("64:ff9b::a9fe:a9fe"), "cloud metadata");
  EXPECT_EQ(kind("2002:7f00:1::"), "loopback");    // 6to4 of 127.0.0.1
  EXPECT_EQ(kind("2002:c0a8:101::1"), "private");  // 6to4 of 192.168.1.1
}

TEST(OutboundPolicy, PublicAddressesAreAllowedWithoutAnAllowList) {
  const Allowlist none;
  EXPECT_TRUE(allowed("93.184.216.34", "example.com", none));
  EXPECT_TRUE(allowed("2606:2800:220:1:248:1893:25c8:1946", "example.com", none));
  EXPECT_TRUE(allowed("8.8.8.8", "", none));
}

TEST(OutboundPolicy, RestrictedAddressesAreRefusedWithAClearMessage) {
  const Allowlist none;
  std::string why;
  EXPECT_FALSE(allowed("127.0.0.1", "localhost", none, &why));
  EXPECT_EQ(why,
            "address 127.0.0.1 is not allowed (loopback) for host \"localhost\": add the host or "
            "the address to the http allow-list to permit it");
  EXPECT_FALSE(allowed("169.254.169.254", "169.254.169.254", none, &why));
  EXPECT_EQ(why,
            "address 169.254.169.254 is not allowed (cloud metadata): add it to the http "
            "allow-list to permit it");
  EXPECT_FALSE(allowed("::1", "[::1]", none, &why));
  EXPECT_EQ(why, "address ::1 is not allowed (loopback): add it to the http allow-list to permit it");
  EXPECT_FALSE(allowed("::ffff:10.0.0.1", "", none, &why));
  EXPECT_EQ(why.rfind("address ::ffff:10.0.0.1 is not allowed (private)", 0), 0u) << why;
  for (const char* a : {"10.0.0.1", "172.16.5.4", "192.168.0.1", "169.254.0.1", "224.0.0.1", "0.0.0.0",
                        "255.255.255.255", "100.64.0.1", "fd00:ec2::254", "fe80::1", "fc00::1", "ff02::1", "::"})
    EXPECT_FALSE(allowed(a, "h.example", none)) << a;
  EXPECT_FALSE(allowed("127.0.0.1", "localhost", none, nullptr));  // why is optional
}

TEST(OutboundPolicy, OtherFamiliesAreRefused) {
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::strcpy(un.sun_path, "/tmp/x");
  std::string why;
  EXPECT_FALSE(address_allowed(reinterpret_cast<sockaddr*>(&un), sizeof un, "x", Allowlist{}, &why));
  EXPECT_NE(why.find("only IPv4 and IPv6"), std::string::npos) << why;
  EXPECT_STREQ(restricted_address_kind(reinterpret_cast<sockaddr*>(&un), sizeof un), "unsupported address family");
  // A truncated length is refused rather than read past.
  Sock s("127.0.0.1");
  EXPECT_FALSE(address_allowed(s.sa(), 4, "", Allowlist{}, &why));
  EXPECT_FALSE(address_allowed(nullptr, 0, "", Allowlist{}, &why));
}

// ---- the allow-list ---------------------------------------------------------------

TEST(OutboundPolicy, AllowListByCidr) {
  const Allowlist a = parse("127.0.0.0/8, ::1/128, 10.1.2.3, 192.168.0.0/16, fd00::/8");
  EXPECT_TRUE(allowed("127.0.0.1", "x", a));
  EXPECT_TRUE(allowed("127.9.9.9", "", a));
  EXPECT_TRUE(allowed("::1", "", a));
  EXPECT_TRUE(allowed("10.1.2.3", "", a));
  EXPECT_FALSE(allowed("10.1.2.4", "", a));
  EXPECT_TRUE(allowed("192.168.77.1", "", a));
  EXPECT_TRUE(allowed("fd12::1", "", a));
  EXPECT_FALSE(allowed("fc00::1", "", a));
  EXPECT_FALSE(allowed("169.254.169.254", "", a));
  // IPv4 entries cover the IPv6 forms of those addresses.
  EXPECT_TRUE(allowed("::ffff:127.0.0.1", "", a));
  EXPECT_TRUE(allowed("::ffff:10.1.2.3", "", a));
  EXPECT_FALSE(allowed("::ffff:10.1.2.4", "", a));
  EXPECT_TRUE(allowed("64:ff9b::7f00:1", "", a));
}

TEST(OutboundPolicy, AllowListByHostName) {
  const Allowlist a = parse("localhost,Hooks.Internal.");
  EXPECT_TRUE(allowed("127.0.0.1", "localhost", a));
  EXPECT_TRUE(allowed("::1", "LOCALHOST", a));
  EXPECT_TRUE(allowed("10.0.0.5", "hooks.internal", a));
  EXPECT_TRUE(allowed("10.0.0.5", "hooks.internal.", a));
  EXPECT_FALSE(allowed("10.0.0.5", "other.internal", a));
  EXPECT_FALSE(allowed("127.0.0.1", "", a));
  EXPECT_FALSE(allowed("127.0.0.1", "127.0.0.1", a));
  EXPECT_FALSE(allowed("10.0.0.5", "x.hooks.internal", a));  // exact, no suffix match
}

TEST(OutboundPolicy, ParseAllowList) {
  Allowlist a = parse(" 127.0.0.1/8 ,localhost,, [::1] , ::ffff:10.0.0.0/104, 0.0.0.0/0,::/0 ,");
  ASSERT_EQ(a.hosts.size(), 1u);
  EXPECT_EQ(a.hosts[0], "localhost");
  ASSERT_EQ(a.cidrs.size(), 5u);
  // 127.0.0.1/8 is stored as 127.0.0.0/8.
  EXPECT_EQ(a.cidrs[0].family, AF_INET);
  EXPECT_EQ(a.cidrs[0].prefix, 8);
  EXPECT_EQ(a.cidrs[0].addr[0], 127);
  EXPECT_EQ(a.cidrs[0].addr[3], 0);
  EXPECT_EQ(a.cidrs[1].family, AF_INET6);
  EXPECT_EQ(a.cidrs[1].prefix, 128);
  // The mapped network is the IPv4 network 10.0.0.0/8.
  EXPECT_EQ(a.cidrs[2].family, AF_INET);
  EXPECT_EQ(a.cidrs[2].prefix, 8);
  EXPECT_EQ(a.cidrs[2].addr[0], 10);
  EXPECT_EQ(a.cidrs[3].prefix, 0);
  EXPECT_EQ(a.cidrs[4].prefix, 0);
  EXPECT_TRUE(parse("").empty());
  EXPECT_TRUE(parse(" , ,").empty());
  EXPECT_TRUE(allowed("169.254.169.254", "", parse("0.0.0.0/0")));
  EXPECT_TRUE(allowed("fe80::1", "", parse("::/0")));
  EXPECT_TRUE(allowed("fe80::1", "", parse("[fe80::]/10")));
}

TEST(OutboundPolicy, ParseAllowListRejectsBadEntries) {
  for (const char* bad : {"10.0.0.0/33", "::1/129", "10.0.0.0/", "10.0.0.0/x", "10.0.0.0/-1", "10.1.2", "10.1.2.3.4",
                          "256.0.0.1", "010.0.0.1", "::1::2", "fe80::zz", "host/8", "[localhost]", "bad host",
                          "*.example.com", "ex@mple.com", ".leading", "10.0.0.0/08/1"}) {
    Allowlist a;
    a.hosts.push_back("untouched");
    std::string why;
    EXPECT_FALSE(parse_allowlist(std::string("localhost,") + bad, &a, &why)) << bad;
    EXPECT_NE(why.find("http allow-list entry"), std::string::npos) << bad << ": " << why;
    ASSERT_EQ(a.hosts.size(), 1u) << "output must not be touched on failure";
    EXPECT_EQ(a.hosts[0], "untouched");
  }
}

TEST(OutboundPolicy, AddressText) {
  Sock v4("10.1.2.3"), v6("fd00:ec2::254"), mapped("::ffff:127.0.0.1");
  EXPECT_EQ(address_text(v4.sa(), v4.len), "10.1.2.3");
  EXPECT_EQ(address_text(v6.sa(), v6.len), "fd00:ec2::254");
  EXPECT_EQ(address_text(mapped.sa(), mapped.len), "::ffff:127.0.0.1");
  EXPECT_EQ(address_text(nullptr, 0), "?");
}

}  // namespace
}  // namespace relaybus::core
