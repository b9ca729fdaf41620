// RoutingSink: one pipeline's deliveries go to the HTTP engine or the Kafka
// producers by their handler's kind (real engine, real producers; no broker
// needed: nothing here waits for an answer).
#include <gtest/gtest.h>

#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "core/routing_sink.hpp"

using namespace relaybus::core;

TEST(RoutingSink, RoutesByKind) {
  HttpEngine engine(HttpEngineOptions{});
  HttpSink http(engine);
  KafkaSink kafka;
  RoutingSink router(http, kafka);

  PipelineHandler k;
  k.key = 2;
  k.kind = HandlerKind::Kafka;
  k.name = "k";
  k.target = "kafka://127.0.0.1:1/t";
  router.set_kind(2, HandlerKind::Kafka);
  router.set_handler_limit(2, 1);
  router.set_handler_limit(1, 5);

  WebhookMessage m;
  m.id = 10;
  m.payload_json = "{}";
  EXPECT_TRUE(router.can_submit(2));
  std::string why;
  ASSERT_TRUE(router.submit(k, m, 0, &why)) << why;
  EXPECT_EQ(kafka.in_flight(2), 1u);
  EXPECT_EQ(router.in_flight(2), 1u);
  EXPECT_EQ(engine.in_flight(), 0u);
  EXPECT_EQ(router.in_flight(), 1u);
  EXPECT_FALSE(router.can_submit(2)) << "the kafka handler's limit (1) is the producer's";
  EXPECT_TRUE(router.can_submit(1)) << "an http handler is the engine's";

  // A handler first seen in a submit is routed by the kind it came with.
  PipelineHandler k2 = k;
  k2.key = 3;
  m.id = 11;
  router.set_handler_limit(3, 4);  // before set_kind: the engine's; the submit moves it
  kafka.set_handler_limit(3, 4);
  ASSERT_TRUE(router.submit(k2, m, 0, &why)) << why;
  EXPECT_EQ(kafka.in_flight(3), 1u);
  EXPECT_EQ(router.in_flight(3), 1u);

  router.cancel_all();
  EXPECT_EQ(router.in_flight(), 0u);
  EXPECT_TRUE(router.take_results().empty()) << "cancelled messages bring no results";
}
