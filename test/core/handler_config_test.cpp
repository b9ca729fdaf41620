#include "core/handler_config.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/base64.hpp"

namespace relaybus::core {
namespace {

using K = HandlerKind;

// ---- kind, names, channels --------------------------------------------------

TEST(HandlerKind, ParseAndName) {
  HandlerKind k = K::Pull;
  ASSERT_TRUE(parse_handler_kind("notify", &k, nullptr));
  EXPECT_EQ(k, K::Notify);
  ASSERT_TRUE(parse_handler_kind("http", &k, nullptr));
  EXPECT_EQ(k, K::Http);
  ASSERT_TRUE(parse_handler_kind("pull", &k, nullptr));
  EXPECT_EQ(k, K::Pull);
  ASSERT_TRUE(parse_handler_kind("kafka", &k, nullptr));
  EXPECT_EQ(k, K::Kafka);
  for (K x : {K::Notify, K::Http, K::Pull, K::Kafka}) {
    HandlerKind back = K::Notify;
    ASSERT_TRUE(parse_handler_kind(handler_kind_name(x), &back, nullptr));
    EXPECT_EQ(back, x);
  }
}

TEST(HandlerKind, RejectsAnythingElse) {
  for (const char* s : {"", "HTTP", "Notify", " http", "http ", "https", "webhook"}) {
    std::string why;
    HandlerKind k = K::Http;
    EXPECT_FALSE(parse_handler_kind(s, &k, &why)) << s;
    EXPECT_EQ(k, K::Http) << "out must not change on failure";
    EXPECT_EQ(why, std::string("expected notify, http, pull or kafka (got \"") + s + "\")");
  }
}

TEST(HandlerName, Valid) {
  for (const char* n : {"a", "orders", "billing.webhook-v2", "x_1", "0", "..."})
    EXPECT_TRUE(is_valid_handler_name(n, nullptr)) << n;
  EXPECT_TRUE(is_valid_handler_name(std::string(63, 'z'), nullptr));
}

TEST(HandlerName, Invalid) {
  std::string why;
  EXPECT_FALSE(is_valid_handler_name("", &why));
  EXPECT_EQ(why, "must not be empty");
  EXPECT_FALSE(is_valid_handler_name(std::string(64, 'a'), &why));
  EXPECT_EQ(why, "longer than 63 bytes");
  EXPECT_FALSE(is_valid_handler_name("Orders", &why));
  EXPECT_EQ(why, "character 'O' is not allowed (only a-z, 0-9, '_', '.' and '-')");
  EXPECT_FALSE(is_valid_handler_name("my handler", &why));
  EXPECT_EQ(why, "a space is not allowed (only a-z, 0-9, '_', '.' and '-')");
  EXPECT_FALSE(is_valid_handler_name("a/b", &why));
  EXPECT_EQ(why, "character '/' is not allowed (only a-z, 0-9, '_', '.' and '-')");
  EXPECT_FALSE(is_valid_handler_name("h\xc3\xa9", &why));
  EXPECT_EQ(why, "byte 0xC3 is not allowed (only a-z, 0-9, '_', '.' and '-')");
}

TEST(Channel, Valid) {
  for (const char* c : {"a", "_", "orders", "Orders_2", "_x9"}) EXPECT_TRUE(is_valid_channel(c, nullptr)) << c;
  EXPECT_TRUE(is_valid_channel(std::string(63, 'c'), nullptr));
}

TEST(Channel, Invalid) {
  std::string why;
  EXPECT_FALSE(is_valid_channel("", &why));
  EXPECT_EQ(why, "must not be empty");
  EXPECT_FALSE(is_valid_channel(std::string(64, 'c'), &why));
  EXPECT_EQ(why, "longer than 63 bytes");
  EXPECT_FALSE(is_valid_channel("1abc", &why));
  EXPECT_EQ(why, "must start with a letter or '_'");
  EXPECT_FALSE(is_valid_channel("a-b", &why));
  EXPECT_EQ(why, "character '-' is not allowed (only A-Z, a-z, 0-9 and '_')");
  EXPECT_FALSE(is_valid_channel("a.b", &why));
  EXPECT_EQ(why, "character '.' is not allowed (only A-Z, a-z, 0-9 and '_')");
  EXPECT_FALSE(is_valid_channel("a\"b", &why));
  EXPECT_EQ(why, "character '\"' is not allowed (only A-Z, a-z, 0-9 and '_')");
}

// ---- URLs --------------------------------------------------------------------

HttpUrl url_ok(std::string_view s) {
  HttpUrl u;
  std::string why;
  EXPECT_TRUE(parse_http_url(s, &u, &why)) << s << ": " << why;
  return u;
}

std::string url_bad(std::string_view s) {
  HttpUrl u;
  u.host = "<unchanged>";
  std::string why;
  EXPECT_FALSE(parse_http_url(s, &u, &why)) << s;
  EXPECT_EQ(u.host, "<unchanged>");
  return why;
}

TEST(HttpUrl, Components) {
  HttpUrl u = url_ok("https://Example.COM/hooks/Orders?x=1&Y=2");
  EXPECT_EQ(u.scheme, "https");
  EXPECT_EQ(u.host, "example.com");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.path, "/hooks/Orders?x=1&Y=2");

  u = url_ok("http://localhost:8080");
  EXPECT_EQ(u.scheme, "http");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, 8080);
  EXPECT_EQ(u.path, "/");

  u = url_ok("HTTP://h?q=1");
  EXPECT_EQ(u.scheme, "http");
  EXPECT_EQ(u.port, 80);
  EXPECT_EQ(u.path, "/?q=1");

  u = url_ok("http://10.0.0.1:1/");
  EXPECT_EQ(u.host, "10.0.0.1");
  EXPECT_EQ(u.port, 1);

  u = url_ok("https://a.b-c.d_e:65535/p%20q/@:;=!$'()*+,~");
  EXPECT_EQ(u.host, "a.b-c.d_e");
  EXPECT_EQ(u.port, 65535);
  EXPECT_EQ(u.path, "/p%20q/@:;=!$'()*+,~");
}

TEST(HttpUrl, Ipv6) {
  HttpUrl u = url_ok("http://[::1]:9000/x");
  EXPECT_EQ(u.host, "[::1]");
  EXPECT_EQ(u.port, 9000);
  EXPECT_EQ(u.path, "/x");
  u = url_ok("https://[2001:DB8::A]");
  EXPECT_EQ(u.host, "[2001:db8::a]");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.path, "/");
  u = url_ok("http://[::ffff:10.0.0.1]/");
  EXPECT_EQ(u.host, "[::ffff:10.0.0.1]");
}

TEST(HttpUrl, NullOutIsAllowed) {
  EXPECT_TRUE(parse_http_url("http://h/", nullptr, nullptr));
  EXPECT_FALSE(parse_http_url("ftp://h/", nullptr, nullptr));
}

TEST(HttpUrl, Rejections) {
  EXPECT_EQ(url_bad(""), "URL must start with http:// or https://");
  EXPECT_EQ(url_bad("example.com/x"), "URL must start with http:// or https://");
  EXPECT_EQ(url_bad("http:/example.com"), "URL must start with http:// or https://");
  EXPECT_EQ(url_bad("ftp://example.com/"), "URL scheme must be http or https (got \"ftp\")");
  EXPECT_EQ(url_bad("ws://example.com/"), "URL scheme must be http or https (got \"ws\")");
  EXPECT_EQ(url_bad("http://"), "URL has no host");
  EXPECT_EQ(url_bad("http:///path"), "URL has no host");
  EXPECT_EQ(url_bad("http://:80/"), "URL has no host");
  EXPECT_EQ(url_bad("http://user:pw@example.com/"), "URL must not contain user credentials (user:password@)");
  EXPECT_EQ(url_bad("http://user@example.com/"), "URL must not contain user credentials (user:password@)");
  EXPECT_EQ(url_bad("http://evil.com\\@good.com/"), "URL must not contain user credentials (user:password@)");
  EXPECT_EQ(url_bad("http://example.com/a#frag"), "URL must not contain a fragment ('#')");
  EXPECT_EQ(url_bad("http://example.com/a b"), "URL must not contain whitespace or control characters");
  EXPECT_EQ(url_bad("http://example.com/\t"), "URL must not contain whitespace or control characters");
  EXPECT_EQ(url_bad(" http://example.com/"), "URL must not contain whitespace or control characters");
  EXPECT_EQ(url_bad("http://example.com/\x7f"), "URL must not contain whitespace or control characters");
  EXPECT_EQ(url_bad("http://b\xc3\xbc"
                    "cher.de/"),
            "URL must be ASCII (percent-encode other characters)");
  EXPECT_EQ(url_bad("http://example.com:0/"), "URL port must be a number between 1 and 65535 (got \"0\")");
  EXPECT_EQ(url_bad("http://example.com:65536/"), "URL port must be a number between 1 and 65535 (got \"65536\")");
  EXPECT_EQ(url_bad("http://example.com:123456/"), "URL port must be a number between 1 and 65535 (got \"123456\")");
  EXPECT_EQ(url_bad("http://example.com:/"), "URL port must be a number between 1 and 65535 (got \"\")");
  EXPECT_EQ(url_bad("http://example.com:8o/"), "URL port must be a number between 1 and 65535 (got \"8o\")");
  EXPECT_EQ(url_bad("http://example.com:80:81/"), "URL port must be a number between 1 and 65535 (got \"80:81\")");
  EXPECT_EQ(url_bad("http://exa%6dple.com/"), "URL has an invalid host \"exa%6dple.com\"");
  EXPECT_EQ(url_bad("http://a..b/"), "URL has an invalid host \"a..b\"");
  EXPECT_EQ(url_bad("http://.a/"), "URL has an invalid host \".a\"");
  EXPECT_EQ(url_bad("http://a./"), "URL has an invalid host \"a.\"");
  EXPECT_EQ(url_bad("http://" + std::string(64, 'a') + ".com/"),
            "URL has an invalid host \"" + std::string(40, 'a') + "...\"");
  EXPECT_EQ(url_bad("http://[::1/"), "URL has an unterminated IPv6 address ('[' without ']')");
  EXPECT_EQ(url_bad("http://[zz::1]/"), "URL has an invalid IPv6 address \"[zz::1]\"");
  EXPECT_EQ(url_bad("http://[]/"), "URL has an invalid IPv6 address \"[]\"");
  EXPECT_EQ(url_bad("http://[fe80::1%25eth0]/"), "URL has an invalid IPv6 address \"[fe80::1%25eth0]\"");
  EXPECT_EQ(url_bad("http://[::1]x/"), "URL has unexpected text after the IPv6 address");
  EXPECT_EQ(url_bad("http://[::1]:0/"), "URL port must be a number between 1 and 65535 (got \"0\")");
  EXPECT_EQ(url_bad("http://h/a%2"), "URL has a '%' not followed by two hex digits");
  EXPECT_EQ(url_bad("http://h/a%zz"), "URL has a '%' not followed by two hex digits");
  EXPECT_EQ(url_bad("http://h/<script>"), "character '<' is not allowed in a URL (percent-encode it)");
  EXPECT_EQ(url_bad("http://h/a\\b"), "character '\\' is not allowed in a URL (percent-encode it)");
  EXPECT_EQ(url_bad("http://h/\"q\""), "character '\"' is not allowed in a URL (percent-encode it)");
}

TEST(HttpUrl, LengthLimit) {
  const std::string base = "http://h/";
  EXPECT_TRUE(parse_http_url(base + std::string(2048 - base.size(), 'p'), nullptr, nullptr));
  EXPECT_EQ(url_bad(base + std::string(2049 - base.size(), 'p')), "URL is longer than 2048 bytes");
}

// ---- targets -------------------------------------------------------------------

TEST(Target, Notify) {
  std::string why;
  EXPECT_TRUE(validate_target(K::Notify, "orders", false, &why));
  EXPECT_FALSE(validate_target(K::Notify, "", true, &why));
  EXPECT_EQ(why, "a notify handler needs a channel name as target");
  EXPECT_FALSE(validate_target(K::Notify, "", false, &why));
  EXPECT_EQ(why, "a notify handler needs a channel name as target");
  EXPECT_FALSE(validate_target(K::Notify, "my-channel", false, &why));
  EXPECT_EQ(why, "channel name \"my-channel\": character '-' is not allowed (only A-Z, a-z, 0-9 and '_')");
  EXPECT_FALSE(validate_target(K::Notify, "9x", false, nullptr));
}

TEST(Target, Http) {
  std::string why;
  EXPECT_TRUE(validate_target(K::Http, "https://example.com/hook", false, &why));
  EXPECT_FALSE(validate_target(K::Http, "", true, &why));
  EXPECT_EQ(why, "an http handler needs a URL as target");
  EXPECT_FALSE(validate_target(K::Http, "", false, &why));
  EXPECT_EQ(why, "an http handler needs a URL as target");
  EXPECT_FALSE(validate_target(K::Http, "orders", false, &why));
  EXPECT_EQ(why, "URL must start with http:// or https://");
}

TEST(Target, Pull) {
  std::string why;
  EXPECT_TRUE(validate_target(K::Pull, "", true, &why));
  EXPECT_TRUE(validate_target(K::Pull, "", false, &why));
  // The text is ignored when it is NULL.
  EXPECT_TRUE(validate_target(K::Pull, "ignored", true, &why));
  EXPECT_FALSE(validate_target(K::Pull, "orders", false, &why));
  EXPECT_EQ(why, "a pull handler takes no target (use NULL)");
}

// ---- options -------------------------------------------------------------------

const std::string kSecret1 = "whsec_" + base64_encode("0123456789abcdef0123456789abcdef");
const std::string kSecret2 = "whsec_" + base64_encode("another key, 24 bytes...");

HandlerOptions opts_ok(K kind, const std::string& json) {
  HandlerOptions o;
  std::string why;
  EXPECT_TRUE(parse_handler_options(kind, json, &o, &why)) << json << ": " << why;
  return o;
}

std::string opts_bad(K kind, const std::string& json) {
  HandlerOptions o;
  o.max_attempts = -99;  // sentinel: must not be touched on failure
  std::string why;
  EXPECT_FALSE(parse_handler_options(kind, json, &o, &why)) << json;
  EXPECT_EQ(o.max_attempts, -99) << json;
  return why;
}

TEST(Options, DefaultsFromEmptyObject) {
  for (K kind : {K::Notify, K::Http, K::Pull}) {
    HandlerOptions o;
    o.max_attempts = 1;
    o.ack = true;
    o.secrets = {"x"};
    ASSERT_TRUE(parse_handler_options(kind, "{}", &o, nullptr));
    EXPECT_EQ(o.max_attempts, 10);
    EXPECT_EQ(o.backoff_base_ms, 1000);
    EXPECT_EQ(o.backoff_max_ms, 600000);
    EXPECT_EQ(o.timeout_ms, 30000);
    EXPECT_EQ(o.concurrency, 16);
    EXPECT_TRUE(o.secrets.empty());
    EXPECT_TRUE(o.headers.empty());
    EXPECT_FALSE(o.ack);
    EXPECT_EQ(o.lease_ms, 30000);
    EXPECT_EQ(o.backoff().base_ms, 1000);
    EXPECT_EQ(o.backoff().max_ms, 600000);
  }
}

TEST(Options, AllHttpOptions) {
  const HandlerOptions o = opts_ok(K::Http, R"({"max_attempts": 5, "backoff_base": "500ms", "backoff_max": "1 hour",
                   "timeout": "10s", "concurrency": 4, "lease": "2min",
                   "secret": [")" + kSecret1 + R"(", ")" +
                                                kSecret2 + R"("],
                   "headers": {"Authorization": "Bearer t", "X-Tenant": "acme"}})");
  EXPECT_EQ(o.max_attempts, 5);
  EXPECT_EQ(o.backoff_base_ms, 500);
  EXPECT_EQ(o.backoff_max_ms, 3600000);
  EXPECT_EQ(o.timeout_ms, 10000);
  EXPECT_EQ(o.concurrency, 4);
  EXPECT_EQ(o.lease_ms, 120000);
  ASSERT_EQ(o.secrets.size(), 2u);
  EXPECT_EQ(o.secrets[0], kSecret1);
  EXPECT_EQ(o.secrets[1], kSecret2);
  ASSERT_EQ(o.headers.size(), 2u);
  EXPECT_EQ(o.headers[0], std::make_pair(std::string("Authorization"), std::string("Bearer t")));
  EXPECT_EQ(o.headers[1], std::make_pair(std::string("X-Tenant"), std::string("acme")));
  EXPECT_EQ(o.backoff().base_ms, 500);
  EXPECT_EQ(o.backoff().max_ms, 3600000);
}

TEST(Options, NotifyAndPullOptions) {
  HandlerOptions o = opts_ok(K::Notify, R"({"ack": true, "concurrency": 1024, "lease": "1d"})");
  EXPECT_TRUE(o.ack);
  EXPECT_EQ(o.concurrency, 1024);
  EXPECT_EQ(o.lease_ms, 86400000);
  o = opts_ok(K::Pull, R"({"max_attempts": 1000, "backoff_base": "1ms", "backoff_max": "7d", "lease": "1s"})");
  EXPECT_EQ(o.max_attempts, 1000);
  EXPECT_EQ(o.backoff_base_ms, 1);
  EXPECT_EQ(o.backoff_max_ms, 7 * 86400000LL);
  EXPECT_EQ(o.lease_ms, 1000);
}

TEST(Options, SingleSecretString) {
  const HandlerOptions o = opts_ok(K::Http, R"({"secret": ")" + kSecret1 + R"("})");
  ASSERT_EQ(o.secrets.size(), 1u);
  EXPECT_EQ(o.secrets[0], kSecret1);
}

TEST(Options, NullMeansDefault) {
  const HandlerOptions o =
      opts_ok(K::Pull, R"({"max_attempts": null, "timeout": null, "ack": null, "secret": null, "lease": null})");
  EXPECT_EQ(o.max_attempts, 10);
  EXPECT_EQ(o.lease_ms, 30000);
  EXPECT_EQ(o.timeout_ms, 30000);
}

TEST(Options, IntegralFloatsAreIntegers) {
  EXPECT_EQ(opts_ok(K::Pull, R"({"max_attempts": 10.0})").max_attempts, 10);
  EXPECT_EQ(opts_ok(K::Pull, R"({"max_attempts": 1e2})").max_attempts, 100);
}

TEST(Options, NotAnObject) {
  for (const char* j : {"", "[]", "null", "42", "\"x\"", "{", "{\"a\":}", "{} {}", "nonsense"})
    EXPECT_EQ(opts_bad(K::Pull, j), "options must be a JSON object") << j;
}

TEST(Options, UnknownOption) {
  EXPECT_EQ(opts_bad(K::Pull, R"({"retries": 3})"), "unknown option \"retries\"");
  EXPECT_EQ(opts_bad(K::Http, R"({"Timeout": "1s"})"), "unknown option \"Timeout\"");
  EXPECT_EQ(opts_bad(K::Http, R"({"secrets": null})"), "unknown option \"secrets\"");
}

TEST(Options, OptionNotForThisKind) {
  EXPECT_EQ(opts_bad(K::Http, R"({"ack": true})"), "option \"ack\" is only valid for notify handlers");
  EXPECT_EQ(opts_bad(K::Pull, R"({"ack": false})"), "option \"ack\" is only valid for notify handlers");
  EXPECT_EQ(opts_bad(K::Notify, R"({"timeout": "1s"})"),
            "option \"timeout\" is only valid for http and kafka handlers");
  EXPECT_EQ(opts_bad(K::Pull, R"({"headers": {}})"), "option \"headers\" is only valid for http handlers");
  EXPECT_EQ(opts_bad(K::Notify, R"({"secret": ")" + kSecret1 + R"("})"),
            "option \"secret\" is only valid for http handlers");
  EXPECT_EQ(opts_bad(K::Pull, R"({"concurrency": 2})"),
            "option \"concurrency\" is only valid for notify, http and kafka handlers");
}

TEST(Options, IntegerRanges) {
  const std::string ma = "option \"max_attempts\" must be an integer between 1 and 1000";
  for (const char* v :
       {"0", "1001", "-1", "\"5\"", "5.5", "true", "[5]", "1e300", "18446744073709551615", "-9223372036854775808"})
    EXPECT_EQ(opts_bad(K::Pull, std::string(R"({"max_attempts": )") + v + "}"), ma) << v;
  const std::string cc = "option \"concurrency\" must be an integer between 1 and 1024";
  for (const char* v : {"0", "1025", "\"16\""})
    EXPECT_EQ(opts_bad(K::Http, std::string(R"({"concurrency": )") + v + "}"), cc) << v;
}

TEST(Options, IntervalsAreStringsOnly) {
  EXPECT_EQ(opts_bad(K::Http, R"({"timeout": "abc"})"),
            "option \"timeout\" must be an interval such as '30s' (got \"abc\")");
  EXPECT_EQ(opts_bad(K::Http, R"({"timeout": 5000})"),
            "option \"timeout\" must be an interval such as '30s' (got 5000)");
  EXPECT_EQ(opts_bad(K::Pull, R"({"lease": true})"), "option \"lease\" must be an interval such as '30s' (got true)");
  EXPECT_EQ(opts_bad(K::Pull, R"({"backoff_base": {"s": 1}})"),
            "option \"backoff_base\" must be an interval such as '1s' (got {\"s\":1})");
  EXPECT_EQ(opts_bad(K::Pull, R"({"backoff_max": "-1s"})"),
            "option \"backoff_max\" must be an interval such as '10min' (got \"-1s\")");
}

TEST(Options, IntervalRanges) {
  EXPECT_EQ(opts_bad(K::Http, R"({"timeout": "2h"})"), "option \"timeout\" must be between 1ms and 1h (got \"2h\")");
  EXPECT_EQ(opts_bad(K::Http, R"({"timeout": "0s"})"), "option \"timeout\" must be between 1ms and 1h (got \"0s\")");
  EXPECT_EQ(opts_bad(K::Pull, R"({"lease": "999ms"})"), "option \"lease\" must be between 1s and 1d (got \"999ms\")");
  EXPECT_EQ(opts_bad(K::Pull, R"({"lease": "25h"})"), "option \"lease\" must be between 1s and 1d (got \"25h\")");
  EXPECT_EQ(opts_bad(K::Pull, R"({"backoff_base": "2d"})"),
            "option \"backoff_base\" must be between 1ms and 1d (got \"2d\")");
  EXPECT_EQ(opts_bad(K::Pull, R"({"backoff_max": "8d"})"),
            "option \"backoff_max\" must be between 1ms and 7d (got \"8d\")");
  EXPECT_EQ(opts_ok(K::Http, R"({"timeout": "1h"})").timeout_ms, 3600000);
  EXPECT_EQ(opts_ok(K::Http, R"({"timeout": "1ms"})").timeout_ms, 1);
}

TEST(Options, BackoffMaxMustNotBeBelowBase) {
  EXPECT_EQ(opts_bad(K::Pull, R"({"backoff_base": "20min"})"),
            "option \"backoff_max\" (10min) must not be less than backoff_base (20min)");
  EXPECT_EQ(opts_bad(K::Pull, R"({"backoff_base": "5s", "backoff_max": "4s"})"),
            "option \"backoff_max\" (4s) must not be less than backoff_base (5s)");
  const HandlerOptions o = opts_ok(K::Pull, R"({"backoff_base": "5s", "backoff_max": "5s"})");
  EXPECT_EQ(o.backoff_max_ms, 5000);
}

TEST(Options, Ack) {
  EXPECT_EQ(opts_bad(K::Notify, R"({"ack": "yes"})"), "option \"ack\" must be true or false");
  EXPECT_EQ(opts_bad(K::Notify, R"({"ack": 1})"), "option \"ack\" must be true or false");
}

TEST(Options, SecretShapeAndFormat) {
  const std::string shape = "option \"secret\" must be a string or an array of 1 to 10 strings";
  const std::string format = "option \"secret\" must be \"whsec_\" followed by the base64 of 1 to 256 bytes";
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": 5})"), shape);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": []})"), shape);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": [5]})"), shape);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": {"a": "b"}})"), shape);
  std::string eleven = "[";
  for (int i = 0; i < 11; ++i) eleven += (i ? ",\"" : "\"") + kSecret1 + "\"";
  eleven += "]";
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": )" + eleven + "}"), shape);
  std::string ten = eleven.substr(0, eleven.rfind(',')) + "]";
  EXPECT_EQ(opts_ok(K::Http, R"({"secret": )" + ten + "}").secrets.size(), 10u);

  EXPECT_EQ(opts_bad(K::Http, R"({"secret": "hunter2"})"), format);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": "whsec_"})"), format);  // 0 bytes
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": "whsec_not base64!"})"), format);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": "WHSEC_Zm9v"})"), format);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": ")" + base64_encode("raw key") + R"("})"), format);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": [")" + kSecret1 + R"(", "whsec_@@"]})"), format + " (element 2)");
  const std::string max_key = "whsec_" + base64_encode(std::string(256, 'k'));
  const std::string too_long = "whsec_" + base64_encode(std::string(257, 'k'));
  EXPECT_EQ(opts_ok(K::Http, R"({"secret": ")" + max_key + R"("})").secrets[0], max_key);
  EXPECT_EQ(opts_bad(K::Http, R"({"secret": ")" + too_long + R"("})"), format);
}

// Standard Webhooks: a signing key has at least 24 bytes. Checked apart from
// parsing (check_secret_strength): a stored shorter key still signs, and only
// create and alter refuse it (docs/webhooks.md).
TEST(Options, SecretShorterThan24BytesIsRefusedOnCreate) {
  const std::string msg = "option \"secret\" must be a key of at least 24 bytes (Standard Webhooks)";
  HandlerOptions o = opts_ok(K::Http, R"({"secret": "whsec_)" + base64_encode(std::string(23, 'k')) + R"("})");
  std::string why;
  EXPECT_FALSE(check_secret_strength(o, &why));
  EXPECT_EQ(why, msg);
  o = opts_ok(K::Http, R"({"secret": "whsec_)" + base64_encode(std::string(24, 'k')) + R"("})");
  EXPECT_TRUE(check_secret_strength(o, &why));
  o = opts_ok(K::Http, R"({"secret": [")" + kSecret1 + R"(", "whsec_dGVzdA=="]})");
  EXPECT_FALSE(check_secret_strength(o, &why));
  EXPECT_EQ(why, msg + " (element 2)");
  EXPECT_TRUE(check_secret_strength(opts_ok(K::Http, "{}"), &why));  // no secret: nothing to check
}

// inline_payload (notify only, default true): false sends only the delivery
// reference on the channel; the consumer fetches the payload (relay_payload).
TEST(Options, InlinePayloadIsANotifyBoolean) {
  EXPECT_TRUE(opts_ok(K::Notify, "{}").inline_payload);
  EXPECT_FALSE(opts_ok(K::Notify, R"({"inline_payload": false})").inline_payload);
  EXPECT_TRUE(opts_ok(K::Notify, R"({"inline_payload": null})").inline_payload);
  EXPECT_EQ(opts_bad(K::Notify, R"({"inline_payload": "no"})"), "option \"inline_payload\" must be true or false");
  EXPECT_EQ(opts_bad(K::Http, R"({"inline_payload": false})"),
            "option \"inline_payload\" is only valid for notify handlers");
  EXPECT_EQ(opts_bad(K::Pull, R"({"inline_payload": false})"),
            "option \"inline_payload\" is only valid for notify handlers");
  EXPECT_NE(options_public_json(K::Notify, opts_ok(K::Notify, R"({"inline_payload": false})"))
                .find("\"inline_payload\":false"),
            std::string::npos);
}

TEST(Options, SecretNeverEchoedInMessages) {
  const std::string why = opts_bad(K::Http, R"({"secret": "whsec_TOPSECRET!"})");
  EXPECT_EQ(why.find("TOPSECRET"), std::string::npos);
}

TEST(Options, Headers) {
  const std::string shape = "option \"headers\" must be a JSON object of string values";
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": []})"), shape);
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": "X-A: b"})"), shape);
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A": 1}})"), shape + " (header \"X-A\")");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A": null}})"), shape + " (header \"X-A\")");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X A": "b"}})"),
            "option \"headers\": \"X A\" is not a valid header name");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A:": "b"}})"),
            "option \"headers\": \"X-A:\" is not a valid header name");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"": "b"}})"), "option \"headers\": \"\" is not a valid header name");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-\u00e9": "b"}})"),
            "option \"headers\": \"X-\xc3\xa9\" is not a valid header name");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A": "b\r\nX-Evil: 1"}})"),
            "option \"headers\": value of header \"X-A\" contains a control character (byte 0x0D)");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A": "b\nc"}})"),
            "option \"headers\": value of header \"X-A\" contains a control character (byte 0x0A)");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A": "b\u0000"}})"),
            "option \"headers\": value of header \"X-A\" contains a control character (byte 0x00)");
  EXPECT_EQ(opts_bad(K::Http, R"({"headers": {"X-A": "x", "x-a": "y"}})"),
            "option \"headers\": header \"x-a\" appears twice");
  // Tabs, UTF-8 and tchar punctuation are fine.
  const HandlerOptions o = opts_ok(K::Http, R"({"headers": {"X-Odd!#$%&'*+.^_`|~": "a\tb \u00e9", "X-Empty": ""}})");
  ASSERT_EQ(o.headers.size(), 2u);
}

TEST(Options, ReservedHeaders) {
  for (const char* h : {"webhook-id", "Webhook-Timestamp", "WEBHOOK-SIGNATURE", "Content-Type", "content-length",
                        "Host", "Transfer-Encoding", "Connection"}) {
    EXPECT_EQ(opts_bad(K::Http, std::string(R"({"headers": {")") + h + R"(": "x"}})"),
              std::string("option \"headers\": header \"") + h + "\" is set by relaybus")
        << h;
  }
}

TEST(Options, HeaderLimits) {
  nlohmann::json many = nlohmann::json::object();
  for (int i = 0; i < 100; ++i) many["X-H" + std::to_string(i)] = "v";
  EXPECT_EQ(opts_ok(K::Http, nlohmann::json{{"headers", many}}.dump()).headers.size(), 100u);
  many["X-H100"] = "v";
  EXPECT_EQ(opts_bad(K::Http, nlohmann::json{{"headers", many}}.dump()),
            "option \"headers\" has more than 100 headers");
  EXPECT_EQ(opts_bad(K::Http, nlohmann::json{{"headers", {{"X-Big", std::string(8193, 'v')}}}}.dump()),
            "option \"headers\": value of header \"X-Big\" is longer than 8192 bytes");
  EXPECT_EQ(opts_ok(K::Http, nlohmann::json{{"headers", {{"X-Big", std::string(8192, 'v')}}}}.dump()).headers.size(),
            1u);
}

TEST(Options, LongValuesAreTruncatedInMessages) {
  const std::string why = opts_bad(K::Http, R"({"timeout": ")" + std::string(500, 'z') + R"("})");
  EXPECT_EQ(why, "option \"timeout\" must be an interval such as '30s' (got \"" + std::string(40, 'z') + "...\")");
}

TEST(Options, NullOutAndWhyAreAllowed) {
  EXPECT_TRUE(parse_handler_options(K::Pull, "{}", nullptr, nullptr));
  EXPECT_FALSE(parse_handler_options(K::Pull, "{\"x\":1}", nullptr, nullptr));
}

// ---- public JSON -----------------------------------------------------------------

TEST(PublicJson, DefaultsPerKind) {
  EXPECT_EQ(options_public_json(K::Pull, HandlerOptions{}),
            R"({"backoff_base":"1s","backoff_max":"10min","lease":"30s","max_attempts":10})");
  EXPECT_EQ(options_public_json(K::Notify, HandlerOptions{}),
            R"({"ack":false,"backoff_base":"1s","backoff_max":"10min","concurrency":16,)"
            R"("inline_payload":true,"lease":"30s","max_attempts":10})");
  EXPECT_EQ(options_public_json(K::Http, HandlerOptions{}),
            R"({"backoff_base":"1s","backoff_max":"10min","concurrency":16,"envelope":true,)"
            R"("follow_redirects":false,"headers":{},"lease":"30s","max_attempts":10,)"
            R"("retry_4xx":false,"timeout":"30s"})");
}

TEST(PublicJson, HidesSecretsAndHeaderValues) {
  const HandlerOptions o =
      opts_ok(K::Http, R"({"secret": ")" + kSecret1 + R"(", "timeout": "1500ms", "backoff_max": "1h",
                  "headers": {"Authorization": "Bearer sekrit"}})");
  const std::string j = options_public_json(K::Http, o);
  EXPECT_EQ(j.find("whsec_"), std::string::npos);
  EXPECT_EQ(j.find("sekrit"), std::string::npos);
  EXPECT_EQ(j, R"({"backoff_base":"1s","backoff_max":"1h","concurrency":16,"envelope":true,)"
               R"("follow_redirects":false,"headers":{"Authorization":"[redacted]"},"lease":"30s",)"
               R"("max_attempts":10,"retry_4xx":false,"timeout":"1500ms"})");
}

TEST(PublicJson, ReparsesToTheSameOptionsForNonHttpKinds) {
  const HandlerOptions o =
      opts_ok(K::Notify, R"({"ack": true, "lease": "90s", "backoff_base": "250ms", "max_attempts": 3})");
  const HandlerOptions back = opts_ok(K::Notify, options_public_json(K::Notify, o));
  EXPECT_EQ(back.ack, true);
  EXPECT_EQ(back.lease_ms, 90000);
  EXPECT_EQ(back.backoff_base_ms, 250);
  EXPECT_EQ(back.max_attempts, 3);
  EXPECT_EQ(options_public_json(K::Notify, back), options_public_json(K::Notify, o));
}

}  // namespace
}  // namespace relaybus::core

using namespace relaybus::core;

TEST(HandlerOptionsHttpFlags, ParsedForHttpAndRejectedElsewhere) {
  HandlerOptions o;
  std::string why;
  ASSERT_TRUE(parse_handler_options(HandlerKind::Http,
                                    R"({"envelope": false, "retry_4xx": true, "follow_redirects": true})", &o, &why))
      << why;
  EXPECT_FALSE(o.envelope);
  EXPECT_TRUE(o.retry_4xx);
  EXPECT_TRUE(o.follow_redirects);
  HandlerOptions d;
  ASSERT_TRUE(parse_handler_options(HandlerKind::Http, "{}", &d, &why));
  EXPECT_TRUE(d.envelope);
  EXPECT_FALSE(d.retry_4xx);
  EXPECT_FALSE(d.follow_redirects);
  EXPECT_FALSE(parse_handler_options(HandlerKind::Pull, R"({"envelope": true})", &o, &why));
  EXPECT_EQ(why, "option \"envelope\" is only valid for http and kafka handlers");
  EXPECT_FALSE(parse_handler_options(HandlerKind::Http, R"({"retry_4xx": "yes"})", &o, &why));
  EXPECT_EQ(why, "option \"retry_4xx\" must be true or false");
}

TEST(HandlerOptions, KeyWindowIsKafkaOnlyAndBounded) {
  EXPECT_EQ(opts_ok(K::Kafka, "{}").key_window, kDefaultKeyWindow);
  EXPECT_EQ(opts_ok(K::Kafka, R"({"key_window": 1})").key_window, 1);
  EXPECT_EQ(opts_ok(K::Kafka, R"({"key_window": 1000})").key_window, 1000);
  EXPECT_EQ(opts_ok(K::Kafka, R"({"key_window": null})").key_window, kDefaultKeyWindow);
  const std::string range = "option \"key_window\" must be an integer between 1 and 1000";
  for (const char* v : {"0", "1001", "-1", "2.5", "\"8\"", "true"})
    EXPECT_EQ(opts_bad(K::Kafka, std::string(R"({"key_window": )") + v + "}"), range) << v;
  EXPECT_EQ(opts_bad(K::Http, R"({"key_window": 4})"), "option \"key_window\" is only valid for kafka handlers");
  const HandlerOptions o = opts_ok(K::Kafka, R"({"key_window": 7})");
  EXPECT_NE(options_public_json(K::Kafka, o).find("\"key_window\":7"), std::string::npos);
  EXPECT_EQ(options_public_json(K::Http, o).find("key_window"), std::string::npos);
}

TEST(HandlerOptions, InFlightLimitCountsAKafkaHandlersRunsOfKeys) {
  HandlerOptions o;
  o.concurrency = 16;
  o.key_window = 32;
  EXPECT_EQ(handler_in_flight_limit(K::Kafka, o), 512);
  EXPECT_EQ(handler_in_flight_limit(K::Http, o), 16);  // key_window is kafka's only
  o.key_window = 1;
  EXPECT_EQ(handler_in_flight_limit(K::Kafka, o), 16);
  o.concurrency = 64;
  o.key_window = 1000;
  EXPECT_EQ(handler_in_flight_limit(K::Kafka, o), kMaxHandlerInFlight);
  o.concurrency = 0;
  o.key_window = 0;
  EXPECT_EQ(handler_in_flight_limit(K::Kafka, o), 1);
}

// The key_window the catalog gives a handler and the one its in-flight bound
// counts are the same rule: an http handler given a key_window (or a kafka
// one given a nonsense 0) bounds both at one delivery per key.
TEST(HandlerOptions, InFlightLimitCountsTheEffectiveKeyWindow) {
  HandlerOptions o;
  o.concurrency = 3;
  for (int w : {-5, 0, 1, 2, 32, 1000}) {
    o.key_window = w;
    for (K k : {K::Kafka, K::Http, K::Notify, K::Pull}) {
      EXPECT_EQ(handler_in_flight_limit(k, o), 3 * effective_key_window(k, o)) << w;
      EXPECT_EQ(effective_key_window(k, o), k == K::Kafka && w > 1 ? w : 1) << w;
    }
  }
}

TEST(HandlerOptions, SharedLimitsAreHttpAndKafkaOnlyAndBounded) {
  const HandlerOptions none = opts_ok(K::Http, "{}");
  EXPECT_FALSE(has_shared_limit(none));
  EXPECT_EQ(options_public_json(K::Http, none).find("rate"), std::string::npos);
  const HandlerOptions c = opts_ok(K::Kafka, R"({"max_concurrency": 2})");
  EXPECT_EQ(c.max_concurrency, 2);
  EXPECT_TRUE(has_shared_limit(c));
  EXPECT_NE(options_public_json(K::Kafka, c).find("\"max_concurrency\":2"), std::string::npos);
  const HandlerOptions r = opts_ok(K::Http, R"({"rate": 2.5})");
  EXPECT_DOUBLE_EQ(r.rate, 2.5);
  EXPECT_EQ(effective_burst(r), 3);
  EXPECT_EQ(effective_burst(opts_ok(K::Http, R"({"rate": 0.1})")), 1);
  EXPECT_EQ(effective_burst(opts_ok(K::Http, R"({"rate": 50, "burst": 5})")), 5);
  const std::string conc = "option \"max_concurrency\" must be an integer between 1 and 100000";
  for (const char* v : {"0", "100001", "-1", "1.5", "\"2\"", "true"})
    EXPECT_EQ(opts_bad(K::Http, std::string(R"({"max_concurrency": )") + v + "}"), conc) << v;
  const std::string rate =
      "option \"rate\" must be a number of deliveries per second greater than 0 and at most 100000";
  for (const char* v : {"0", "-0.5", "100000.5", "1e300", "\"50\"", "[]"})
    EXPECT_EQ(opts_bad(K::Http, std::string(R"({"rate": )") + v + "}"), rate) << v;
  EXPECT_EQ(opts_bad(K::Http, R"({"rate": 5, "burst": 0})"),
            "option \"burst\" must be an integer between 1 and 100000");
  EXPECT_EQ(opts_bad(K::Http, R"({"burst": 5})"), "option \"burst\" needs option \"rate\"");
  EXPECT_EQ(opts_bad(K::Notify, R"({"rate": 5})"), "option \"rate\" is only valid for http and kafka handlers");
  EXPECT_EQ(opts_bad(K::Pull, R"({"max_concurrency": 5})"),
            "option \"max_concurrency\" is only valid for http and kafka handlers");
}
