// The kafka handler kind's target and options (no broker needed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/handler_config.hpp"
#include "core/kafka_config.hpp"
#include "core/kafka_sink.hpp"

using namespace relaybus::core;

namespace {

std::string target_bad(const std::string& t) {
  KafkaTarget out{"untouched", "untouched"};
  std::string why;
  EXPECT_FALSE(parse_kafka_target(t, &out, &why)) << t;
  EXPECT_EQ(out.bootstrap, "untouched") << t;
  return why;
}

std::string options_bad(const std::string& json) {
  HandlerOptions o;
  std::string why;
  EXPECT_FALSE(parse_handler_options(HandlerKind::Kafka, json, &o, &why)) << json;
  return why;
}

}  // namespace

TEST(KafkaTarget, Parsed) {
  KafkaTarget t;
  std::string why;
  ASSERT_TRUE(parse_kafka_target("kafka://127.0.0.1:9092/orders", &t, &why)) << why;
  EXPECT_EQ(t.bootstrap, "127.0.0.1:9092");
  EXPECT_EQ(t.topic, "orders");
  ASSERT_TRUE(parse_kafka_target("kafka://b1.example.com:9092,b2:9093,[::1]:9094/a.b_c-D", &t, &why)) << why;
  EXPECT_EQ(t.bootstrap, "b1.example.com:9092,b2:9093,[::1]:9094");
  EXPECT_EQ(t.topic, "a.b_c-D");
  EXPECT_TRUE(validate_target(HandlerKind::Kafka, "kafka://h:1/t", false, &why)) << why;
}

TEST(KafkaTarget, Rejections) {
  EXPECT_EQ(target_bad("http://h:1/t"), "target must be kafka://host:port[,host:port...]/topic");
  EXPECT_EQ(target_bad("kafka://h:9092"), "a kafka target needs a topic: kafka://host:port/topic");
  EXPECT_EQ(target_bad("kafka://h:9092/"), "a kafka target needs a topic: kafka://host:port/topic");
  EXPECT_EQ(target_bad("kafka:///t"), "a kafka target needs at least one broker: kafka://host:port/topic");
  EXPECT_EQ(target_bad("kafka://h/t"), "broker \"h\" needs a port (host:port)");
  EXPECT_EQ(target_bad("kafka://h:0/t"), "broker \"h:0\": port must be a number between 1 and 65535");
  EXPECT_EQ(target_bad("kafka://h:65536/t"), "broker \"h:65536\": port must be a number between 1 and 65535");
  EXPECT_EQ(target_bad("kafka://h:1,,h:2/t"), "target has an empty broker in its list");
  EXPECT_EQ(target_bad("kafka://bad host:1/t"), "target must be ASCII without whitespace or control characters");
  EXPECT_EQ(target_bad("kafka://h*:1/t"), "broker \"h*:1\" has an invalid host");
  EXPECT_EQ(target_bad("kafka://[zz]:1/t"), "broker \"[zz]:1\" has an invalid IPv6 address");
  EXPECT_EQ(target_bad("kafka://u:p@h:1/t"),
            "target must not contain credentials (use the producer option's sasl.* properties)");
  EXPECT_EQ(target_bad("kafka://h:1/a/b"),
            "topic \"a/b\": character '/' is not allowed (only A-Z, a-z, 0-9, '.', '_' and '-')");
  EXPECT_EQ(target_bad("kafka://h:1/.."), "topic must not be \".\" or \"..\"");
  EXPECT_EQ(target_bad("kafka://h:1/" + std::string(250, 'x')), "topic is longer than 249 bytes");
  std::string why;
  EXPECT_FALSE(validate_target(HandlerKind::Kafka, "", true, &why));
  EXPECT_EQ(why, "a kafka handler needs kafka://host:port/topic as target");
}

TEST(KafkaOptions, DefaultsAndCommonOptions) {
  HandlerOptions o;
  std::string why;
  ASSERT_TRUE(parse_handler_options(HandlerKind::Kafka, "{}", &o, &why)) << why;
  EXPECT_FALSE(o.envelope) << "kafka sends the payload alone by default";
  EXPECT_EQ(o.timeout_ms, 30000);
  EXPECT_EQ(o.concurrency, 16);
  ASSERT_TRUE(parse_handler_options(HandlerKind::Kafka,
                                    R"({"max_attempts": 3, "backoff_base": "10ms", "backoff_max": "1s",
                                        "concurrency": 100, "lease": "2min", "timeout": "5s",
                                        "envelope": true,
                                        "producer": {"linger.ms": "1", "compression.type": "lz4",
                                                     "security.protocol": "SASL_SSL",
                                                     "sasl.mechanism": "PLAIN",
                                                     "sasl.username": "u", "sasl.password": "hunter2"}})",
                                    &o, &why))
      << why;
  EXPECT_EQ(o.max_attempts, 3);
  EXPECT_EQ(o.concurrency, 100);
  EXPECT_EQ(o.timeout_ms, 5000);
  EXPECT_TRUE(o.envelope);
  ASSERT_EQ(o.producer.size(), 6u);
  // The public view hides credentials and keeps the rest.
  const auto pub = nlohmann::json::parse(options_public_json(HandlerKind::Kafka, o));
  EXPECT_EQ(pub["producer"]["sasl.password"], "[redacted]");
  EXPECT_EQ(pub["producer"]["sasl.username"], "[redacted]");
  EXPECT_EQ(pub["producer"]["compression.type"], "lz4");
  EXPECT_EQ(pub["timeout"], "5s");
  EXPECT_EQ(pub["envelope"], true);
  EXPECT_EQ(pub.dump().find("hunter2"), std::string::npos);
}

TEST(KafkaOptions, ProducerValidatedByLibrdkafka) {
  EXPECT_EQ(options_bad(R"({"producer": {"no.such.property": "1"}})"),
            "option \"producer\": unknown librdkafka property \"no.such.property\"");
  const std::string bad_value = options_bad(R"({"producer": {"linger.ms": "soon"}})");
  EXPECT_NE(bad_value.find("linger.ms"), std::string::npos) << bad_value;
  EXPECT_EQ(bad_value.rfind("option \"producer\": ", 0), 0u) << bad_value;
  EXPECT_EQ(options_bad(R"({"producer": {"linger.ms": 5}})"),
            "option \"producer\" must be a JSON object of librdkafka properties with string values "
            "(property \"linger.ms\")");
  EXPECT_EQ(options_bad(R"({"producer": ["linger.ms"]})"),
            "option \"producer\" must be a JSON object of librdkafka properties with string values");
}

TEST(KafkaOptions, PinnedAndDangerousPropertiesRefused) {
  for (const char* p : {"enable.idempotence", "acks", "bootstrap.servers", "transactional.id", "message.timeout.ms",
                        "max.in.flight.requests.per.connection", "retries"}) {
    EXPECT_EQ(options_bad(std::string(R"({"producer": {")") + p + R"(": "1"}})"),
              std::string("option \"producer\": property \"") + p + "\" is set by relaybus");
  }
  EXPECT_EQ(options_bad(R"({"producer": {"sasl.kerberos.kinit.cmd": "touch /tmp/x"}})"),
            "option \"producer\": property \"sasl.kerberos.kinit.cmd\" is not allowed "
            "(it loads code or runs a command in the server)");
  EXPECT_EQ(options_bad(R"({"producer": {"plugin.library.paths": "/tmp/x.so"}})"),
            "option \"producer\": property \"plugin.library.paths\" is not allowed "
            "(it loads code or runs a command in the server)");
}

TEST(KafkaOptions, HttpOnlyOptionsRefused) {
  EXPECT_EQ(options_bad(R"({"secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"})"),
            "option \"secret\" is only valid for http handlers");
  EXPECT_EQ(options_bad(R"({"headers": {}})"), "option \"headers\" is only valid for http handlers");
  EXPECT_EQ(options_bad(R"({"retry_4xx": true})"), "option \"retry_4xx\" is only valid for http handlers");
  std::string why;
  HandlerOptions o;
  EXPECT_FALSE(parse_handler_options(HandlerKind::Http, R"({"producer": {}})", &o, &why));
  EXPECT_EQ(why, "option \"producer\" is only valid for kafka handlers");
}

TEST(KafkaErrors, PermanentOnesGoToDeadLetters) {
  EXPECT_TRUE(kafka_error_is_permanent(10));     // MSG_SIZE_TOO_LARGE
  EXPECT_TRUE(kafka_error_is_permanent(29));     // TOPIC_AUTHORIZATION_FAILED
  EXPECT_TRUE(kafka_error_is_permanent(-188));   // __UNKNOWN_TOPIC
  EXPECT_FALSE(kafka_error_is_permanent(-192));  // __MSG_TIMED_OUT: the broker may come back
  EXPECT_FALSE(kafka_error_is_permanent(-195));  // __TRANSPORT
  EXPECT_FALSE(kafka_error_is_permanent(6));     // NOT_LEADER_FOR_PARTITION
}
