#include "core/trace_context.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/cloudevents.hpp"
#include "core/webhook_delivery.hpp"

using namespace relaybus::core;

namespace {

const char kValid[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

}  // namespace

TEST(TraceContext, TraceparentOfLevel1) {
  EXPECT_TRUE(valid_traceparent(kValid));
  EXPECT_TRUE(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
  // A later version: parsed as 00, and may carry more after a '-'.
  EXPECT_TRUE(valid_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_TRUE(valid_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds"));
  // W3C's invalid examples (trace-context test suite and the spec).
  const char* invalid[] = {
      "",
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // trace-id all zero
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // parent-id all zero
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",   // upper case
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // 00 is exactly 55
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
      "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.what",  // more without '-'
      "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",        // trace-id too short
      "00-4bf92f3577b34da6a3ce929d0e0e47366-0f067aa0ba902b7-01",       // misplaced '-'
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-701",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-g1",  // not hex
      "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
      " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
      "00-4bf92f3577b34da6a3ce9z9d0e0e4736-00f067aa0ba902b7-01",
  };
  for (const char* v : invalid) EXPECT_FALSE(valid_traceparent(v)) << v;
}

TEST(TraceContext, TracestateOfLevel1) {
  EXPECT_TRUE(valid_tracestate(""));
  EXPECT_TRUE(valid_tracestate("congo=t61rcWkgMzE"));
  EXPECT_TRUE(valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
  EXPECT_TRUE(valid_tracestate("rojo=1 , ,\tcongo=2,"));  // OWS and empty members
  EXPECT_TRUE(valid_tracestate("fw529a3039@dt=abc,1tenant@vendor=x"));
  EXPECT_TRUE(valid_tracestate("a=b c"));  // space inside a value
  std::string members32, members33;
  for (int i = 0; i < 33; i++) {
    std::string m = "k" + std::to_string(i) + "=v";
    if (i < 32) members32 += (i ? "," : "") + m;
    members33 += (i ? "," : "") + m;
  }
  EXPECT_TRUE(valid_tracestate(members32));
  EXPECT_FALSE(valid_tracestate(members33)) << "33 list-members";
  EXPECT_TRUE(valid_tracestate("a=" + std::string(250, 'x') + ",b=" + std::string(250, 'y')));
  EXPECT_FALSE(valid_tracestate("a=" + std::string(255, 'x') + ",b=" + std::string(255, 'y'))) << "over 512";
  const char* invalid[] = {
      "foo=1,foo=2",  // a key twice
      "Foo=1",        // upper case key
      "1foo=1",       // a simple key starts with a letter
      "foo",          // no '='
      "foo=",         // empty value
      "foo=a=b",      // '=' in a value
      "foo=a,b",      // a member without '='
      "foo=\x01",
      "t@Vendor=1",           // system-id lower case
      "t@vendorvendor123=1",  // system-id over 14
  };
  for (const char* v : invalid) EXPECT_FALSE(valid_tracestate(v)) << v;
}

TEST(TraceContext, NewSpanPerAttempt) {
  EXPECT_EQ(span_id_hex(0x00f067aa0ba902b7ull), "00f067aa0ba902b7");
  EXPECT_EQ(span_id_hex(0), "0000000000000001") << "never all zeros";
  const std::string a = attempt_traceparent(kValid, 0x1122334455667788ull);
  EXPECT_EQ(a, "00-4bf92f3577b34da6a3ce929d0e0e4736-1122334455667788-01");
  EXPECT_TRUE(valid_traceparent(a));
  EXPECT_TRUE(valid_traceparent(attempt_traceparent(kValid, 0)));
  // A later version goes out as 00 with its trace-id and flags.
  EXPECT_EQ(attempt_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-more", 1),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-03");
}

TEST(TraceContext, FromHeaders) {
  EXPECT_FALSE(trace_context_from_headers("").present());
  EXPECT_FALSE(trace_context_from_headers(R"({"x":"traceparent"})").present());
  TraceContext tc =
      trace_context_from_headers(std::string(R"({"a":1,"traceparent":")") + kValid + R"(","tracestate":"k=v"})");
  EXPECT_EQ(tc.traceparent, kValid);
  EXPECT_EQ(tc.tracestate, "k=v");
  tc = trace_context_from_headers(std::string(R"({"traceparent":")") + kValid + R"(","tracestate":"K=v"})");
  EXPECT_EQ(tc.traceparent, kValid);
  EXPECT_EQ(tc.tracestate, "") << "an invalid tracestate is dropped, the traceparent kept";
  EXPECT_FALSE(trace_context_from_headers(R"({"traceparent":"00-x","tracestate":"k=v"})").present());
  EXPECT_FALSE(trace_context_from_headers(R"({"traceparent":5})").present());
  EXPECT_FALSE(trace_context_from_headers(R"(["traceparent"])").present());
  EXPECT_FALSE(trace_context_from_headers(R"({"traceparent":)").present()) << "not JSON";
}

TEST(TraceContext, Sqlcommenter) {
  TraceContext tc = sqlcommenter_trace_context(
      "SELECT relay_publish('t', '{}') /*action='x',traceparent='00-4bf92f3577b34da6a3ce929d0e0e4736-"
      "00f067aa0ba902b7-01',tracestate='congo%3Dt61rcWkgMzE%2Crojo%3D1'*/");
  EXPECT_EQ(tc.traceparent, kValid);
  EXPECT_EQ(tc.tracestate, "congo=t61rcWkgMzE,rojo=1");
  // Outside a comment: a string literal is not a comment.
  EXPECT_FALSE(
      sqlcommenter_trace_context("SELECT 'traceparent=''00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'''")
          .present());
  EXPECT_FALSE(sqlcommenter_trace_context("/* traceparent= */ SELECT 1").present());
  EXPECT_FALSE(sqlcommenter_trace_context("/*traceparent='unterminated").present());
  // Only the last 4 kB are read.
  std::string far = std::string("/*traceparent='") + kValid + "'*/ SELECT '" + std::string(5000, 'x') + "'";
  EXPECT_FALSE(sqlcommenter_trace_context(far).present());
  std::string near = "SELECT '" + std::string(5000, 'x') + "' /*traceparent='" + kValid + "'*/";
  EXPECT_EQ(sqlcommenter_trace_context(near).traceparent, kValid);
  // Any bytes: no throw, no read past the end.
  for (const char* s : {"", "'", "/*", "/*traceparent", "/*traceparent=", "/*traceparent='", "/*traceparent='%",
                        "/*traceparent='%4", "/*traceparent='\\", "traceparent='a'"})
    (void)sqlcommenter_trace_context(s);
}

// The request of an attempt with a trace context carries it, replacing the
// handler's own trace headers; the body stays what it was.
TEST(TraceContext, WebhookAndCloudEventsCarryTheAttemptsSpan) {
  HandlerOptions o;
  std::string why;
  ASSERT_TRUE(parse_handler_options(HandlerKind::Http, R"({"headers":{"TraceParent":"forged","x":"y"}})", &o, &why))
      << why;
  WebhookMessage m{42, 7, "t", false, "", 0, 1700000000123, 1, R"({"traceparent":"x"})", "{}", {}};
  const HttpRequest plain = build_webhook_request(o, "http://h/", 1, m, 1700000001);
  m.trace.traceparent = attempt_traceparent(kValid, 5);
  m.trace.tracestate = "k=v";
  const HttpRequest traced = build_webhook_request(o, "http://h/", 1, m, 1700000001);
  EXPECT_EQ(plain.body, traced.body);
  std::multiset<std::string> names;
  for (const auto& kv : traced.headers) names.insert(kv.first);
  EXPECT_EQ(names.count("TraceParent"), 0u);
  EXPECT_EQ(names.count("traceparent"), 1u);
  for (const auto& kv : traced.headers) {
    if (kv.first == "traceparent") {
      EXPECT_EQ(kv.second, "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000005-01");
    }
    if (kv.first == "tracestate") {
      EXPECT_EQ(kv.second, "k=v");
    }
  }
  for (const auto& kv : plain.headers) EXPECT_NE(kv.first, "traceparent");

  ASSERT_TRUE(parse_handler_options(HandlerKind::Http, R"({"cloudevents":"structured"})", &o, &why)) << why;
  const HttpRequest s = build_webhook_request(o, "http://h/", 1, m, 1700000001);
  EXPECT_NE(s.body.find(R"("traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000005-01")"),
            std::string::npos);
  EXPECT_NE(s.body.find(R"("tracestate":"k=v")"), std::string::npos);
  ASSERT_TRUE(parse_handler_options(HandlerKind::Http, R"({"cloudevents":"binary"})", &o, &why)) << why;
  const CloudEventMessage b = make_cloudevent(o, m, CloudEventsBinding::Kafka);
  bool seen = false;
  for (const auto& kv : b.headers) seen = seen || (kv.first == "ce_traceparent" && kv.second == m.trace.traceparent);
  EXPECT_TRUE(seen);
}
