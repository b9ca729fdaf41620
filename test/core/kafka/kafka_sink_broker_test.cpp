// KafkaSink against a real broker (suite core-kafka: test/run_all.sh starts
// one with scripts/kafka-broker.sh and passes KAFKA_BOOTSTRAP=host:port).
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <poll.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "core/kafka_sink.hpp"

using namespace relaybus::core;

namespace {

std::string bootstrap() {
  const char* b = getenv("KAFKA_BOOTSTRAP");
  return b ? b : "";
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string unique_topic(const char* base) {
  return std::string(base) + "-" + std::to_string(now_ms()) + "-" + std::to_string(getpid());
}

// Creates a topic with the given configs through the admin API.
void create_topic(const std::string& topic, int partitions, const std::map<std::string, std::string>& configs) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  ASSERT_EQ(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap().c_str(), err, sizeof err), RD_KAFKA_CONF_OK);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  ASSERT_NE(rk, nullptr) << err;
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(topic.c_str(), partitions, 1, err, sizeof err);
  for (const auto& kv : configs) rd_kafka_NewTopic_set_config(nt, kv.first.c_str(), kv.second.c_str());
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &nt, 1, nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 20000);
  ASSERT_NE(ev, nullptr);
  const rd_kafka_CreateTopics_result_t* res = rd_kafka_event_CreateTopics_result(ev);
  size_t n = 0;
  const rd_kafka_topic_result_t** tr = rd_kafka_CreateTopics_result_topics(res, &n);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(rd_kafka_topic_result_error(tr[0]), RD_KAFKA_RESP_ERR_NO_ERROR)
      << rd_kafka_topic_result_error_string(tr[0]);
  rd_kafka_event_destroy(ev);
  rd_kafka_NewTopic_destroy(nt);
  rd_kafka_queue_destroy(q);
  rd_kafka_destroy(rk);
}

struct Consumed {
  int partition;
  int64_t offset;
  std::string key;
  bool has_key;
  std::string value;
  std::map<std::string, std::string> headers;
};

// Reads every partition of the topic from the start until `want` messages
// came or 30 s passed.
std::vector<Consumed> consume(const std::string& topic, int partitions, size_t want) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap().c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "group.id", ("t-" + topic).c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; p++)
    rd_kafka_topic_partition_list_add(parts, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(rk, parts);
  rd_kafka_topic_partition_list_destroy(parts);
  std::vector<Consumed> out;
  const int64_t deadline = now_ms() + 30000;
  while (out.size() < want && now_ms() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 200);
    if (!m) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      Consumed c;
      c.partition = m->partition;
      c.offset = m->offset;
      c.has_key = m->key != nullptr;
      if (m->key) c.key.assign(static_cast<const char*>(m->key), m->key_len);
      c.value.assign(static_cast<const char*>(m->payload), m->len);
      rd_kafka_headers_t* h = nullptr;
      if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char* name;
        const void* val;
        size_t size;
        for (size_t i = 0; rd_kafka_header_get_all(h, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
          c.headers[name] = std::string(static_cast<const char*>(val), size);
      }
      out.push_back(std::move(c));
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return out;
}

PipelineHandler handler_for(const std::string& topic, int key = 1) {
  PipelineHandler h;
  h.key = key;
  h.name = "kafka-test";
  h.target = "kafka://" + bootstrap() + "/" + topic;
  h.options.envelope = false;
  h.options.timeout_ms = 20000;
  h.options.concurrency = 1000;
  return h;
}

WebhookMessage message(int64_t id, const std::string& key, int64_t seq, const std::string& payload) {
  WebhookMessage m;
  m.id = id;
  m.event_id = 1000 + id;
  m.topic = "orders.created";
  m.has_key = !key.empty();
  m.key = key;
  m.seq = seq;
  m.published_at_ms = 1700000000123;
  m.attempt = 2;
  m.headers_json = R"({"trace": "t-)" + std::to_string(id) + R"(", "relay-id": "forged", "n": 5})";
  m.payload_json = payload;
  return m;
}

// Waits on the sink's fd like a host loop, serving it, until n results came.
std::vector<HttpResult> wait_results(KafkaSink& sink, size_t n, int64_t timeout_ms = 30000) {
  std::vector<HttpResult> all;
  const int64_t deadline = now_ms() + timeout_ms;
  while (all.size() < n && now_ms() < deadline) {
    struct pollfd p = {sink.wait_fd(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    for (auto& r : sink.take_results()) all.push_back(std::move(r));
  }
  return all;
}

class KafkaSinkBroker : public ::testing::Test {
 protected:
  void SetUp() override {
    if (bootstrap().empty()) GTEST_FAIL() << "KAFKA_BOOTSTRAP is not set (run through test/run_all.sh core-kafka)";
  }
};

}  // namespace

TEST_F(KafkaSinkBroker, OrderedPerKeyWithHeaders) {
  const std::string topic = unique_topic("ordered");
  create_topic(topic, 3, {});
  KafkaSink sink;
  ASSERT_TRUE(sink.ok());
  PipelineHandler h = handler_for(topic);
  sink.set_handler_limit(h.key, h.options.concurrency);
  const int kKeys = 4, kPerKey = 25;
  int64_t id = 1;
  for (int s = 1; s <= kPerKey; s++)
    for (int k = 0; k < kKeys; k++) {
      std::string why;
      ASSERT_TRUE(
          sink.submit(h, message(id++, "key-" + std::to_string(k), s, R"({"n":)" + std::to_string(s) + "}"), 0, &why))
          << why;
    }
  WebhookMessage unkeyed = message(id++, "", 0, R"({"unkeyed":true})");
  ASSERT_TRUE(sink.submit(h, unkeyed, 0, nullptr));
  EXPECT_EQ(sink.in_flight(h.key), static_cast<size_t>(kKeys * kPerKey + 1));
  auto results = wait_results(sink, kKeys * kPerKey + 1);
  ASSERT_EQ(results.size(), static_cast<size_t>(kKeys * kPerKey + 1));
  // Where each acknowledgement says its message landed (a span's
  // messaging.destination.partition.id and messaging.kafka.offset).
  std::map<int64_t, std::pair<int, int64_t>> landed;
  for (const auto& r : results) {
    EXPECT_EQ(r.outcome, HttpOutcome::Success) << r.error;
    EXPECT_EQ(r.handler_key, h.key);
    landed[static_cast<int64_t>(r.tag)] = {r.kafka_partition, r.kafka_offset};
  }
  EXPECT_EQ(sink.in_flight(), 0u);

  auto got = consume(topic, 3, kKeys * kPerKey + 1);
  ASSERT_EQ(got.size(), static_cast<size_t>(kKeys * kPerKey + 1));
  std::map<std::string, int> partition_of;
  std::map<std::string, int64_t> last_seq;
  std::map<int, int64_t> last_offset;
  for (const auto& c : got) {
    if (!c.has_key) {
      EXPECT_EQ(c.value, R"({"unkeyed":true})");
      EXPECT_EQ(c.headers.count("relay-key"), 0u);
      EXPECT_EQ(c.headers.count("relay-seq"), 0u);
      continue;
    }
    // One key, one partition; within it, seq ascending in offset order.
    EXPECT_TRUE(last_offset.count(c.partition) == 0 || c.offset > last_offset[c.partition]);
    last_offset[c.partition] = c.offset;
    if (partition_of.count(c.key)) {
      EXPECT_EQ(partition_of[c.key], c.partition) << c.key;
    }
    partition_of[c.key] = c.partition;
    const int64_t seq = std::stoll(c.headers.at("relay-seq"));
    EXPECT_EQ(seq, last_seq[c.key] + 1) << c.key;
    last_seq[c.key] = seq;
    EXPECT_EQ(c.value, R"({"n":)" + std::to_string(seq) + "}");
    EXPECT_EQ(c.headers.at("relay-key"), c.key);
    const int64_t rid = std::stoll(c.headers.at("relay-id"));
    EXPECT_EQ(landed[rid], std::make_pair(c.partition, c.offset)) << "the acknowledgement names partition and offset";
    EXPECT_EQ(c.headers.at("relay-event-id"), std::to_string(1000 + rid));
    EXPECT_EQ(c.headers.at("relay-topic"), "orders.created");
    EXPECT_EQ(c.headers.at("relay-attempt"), "2");
    EXPECT_EQ(c.headers.at("relay-published-at"), "2023-11-14T22:13:20.123Z");
    EXPECT_EQ(c.headers.at("trace"), "t-" + std::to_string(rid));  // the event's own header
    EXPECT_EQ(c.headers.count("n"), 0u);                           // not a string: left out
  }
  for (int k = 0; k < kKeys; k++) EXPECT_EQ(last_seq["key-" + std::to_string(k)], kPerKey);
}

TEST_F(KafkaSinkBroker, EnvelopeAsValue) {
  const std::string topic = unique_topic("envelope");
  create_topic(topic, 1, {});
  KafkaSink sink;
  PipelineHandler h = handler_for(topic);
  h.options.envelope = true;
  sink.set_handler_limit(h.key, 10);
  ASSERT_TRUE(sink.submit(h, message(7, "k", 3, R"({"a":1})"), 0, nullptr));
  auto r = wait_results(sink, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].outcome, HttpOutcome::Success) << r[0].error;
  auto got = consume(topic, 1, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].value, webhook_envelope_json(7, 1007, "orders.created", &got[0].key, 3, 1700000000123, 2,
                                                R"({"trace": "t-7", "relay-id": "forged", "n": 5})", R"({"a":1})"));
}

TEST_F(KafkaSinkBroker, TooLargeForTheBrokerIsPermanentWithItsError) {
  const std::string topic = unique_topic("small");
  create_topic(topic, 1, {{"max.message.bytes", "1000"}});
  KafkaSink sink;
  PipelineHandler h = handler_for(topic);
  h.options.max_attempts = 10;
  // Batches no larger than the topic allows (docs/kafka.md): else the broker
  // refuses a whole batch and its small messages share the big one's fate.
  h.options.producer = {{"batch.size", "1000"}};
  sink.set_handler_limit(h.key, 10);
  const std::string big = "\"" + std::string(5000, 'x') + "\"";
  ASSERT_TRUE(sink.submit(h, message(1, "k", 1, big), 0, nullptr));
  ASSERT_TRUE(sink.submit(h, message(2, "k2", 1, R"("small")"), 0, nullptr));
  auto r = wait_results(sink, 2);
  ASSERT_EQ(r.size(), 2u);
  for (const auto& x : r) {
    if (x.tag == 2) {
      EXPECT_EQ(x.outcome, HttpOutcome::Success) << x.error;
      continue;
    }
    EXPECT_EQ(x.outcome, HttpOutcome::Fail);
    EXPECT_NE(x.error.find("Broker: Message size too large"), std::string::npos) << x.error;
    EXPECT_NE(x.error.find("MSG_SIZE_TOO_LARGE"), std::string::npos) << x.error;
    // The pipeline's rules send it to dead letters on its first attempt.
    const Completion c = classify_result(h, x, 1, 42);
    EXPECT_EQ(c.outcome, CompletionOutcome::Dead);
    EXPECT_EQ(c.error, x.error);
  }
}

TEST_F(KafkaSinkBroker, TheFdWakesTheLoopOnlyWhenSomethingCame) {
  const std::string topic = unique_topic("wake");
  create_topic(topic, 1, {});
  KafkaSink sink;
  PipelineHandler h = handler_for(topic);
  sink.set_handler_limit(h.key, 10);
  struct pollfd p = {sink.wait_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "nothing produced yet";
  ASSERT_TRUE(sink.submit(h, message(1, "k", 1, "1"), 0, nullptr));
  const int64_t t0 = now_ms();
  p.revents = 0;
  ASSERT_EQ(::poll(&p, 1, 20000), 1) << "the delivery report must make the fd readable";
  EXPECT_LT(now_ms() - t0, 20000);
  auto r = sink.take_results();
  // The first wake may be a log line or an error of the connection; results follow.
  if (r.empty()) r = wait_results(sink, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].outcome, HttpOutcome::Success) << r[0].error;
  // Served: quiet again.
  p.revents = 0;
  EXPECT_EQ(::poll(&p, 1, 300), 0);
}

TEST_F(KafkaSinkBroker, ConcurrencyLimitAndProducerReplacedWhenTheHandlerChanges) {
  const std::string topic = unique_topic("limit");
  create_topic(topic, 1, {});
  KafkaSink sink;
  PipelineHandler h = handler_for(topic);
  sink.set_handler_limit(h.key, 2);
  ASSERT_TRUE(sink.can_submit(h.key));
  ASSERT_TRUE(sink.submit(h, message(1, "k", 1, "1"), 0, nullptr));
  ASSERT_TRUE(sink.submit(h, message(2, "k", 2, "2"), 0, nullptr));
  EXPECT_FALSE(sink.can_submit(h.key));
  EXPECT_EQ(wait_results(sink, 2).size(), 2u);
  EXPECT_TRUE(sink.can_submit(h.key));
  EXPECT_EQ(sink.producers(), 1u);
  h.options.producer = {{"linger.ms", "0"}};
  ASSERT_TRUE(sink.submit(h, message(3, "k", 3, "3"), 0, nullptr));
  auto r = wait_results(sink, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].outcome, HttpOutcome::Success) << r[0].error;
  EXPECT_EQ(sink.producers(), 1u);
  sink.retain_handlers({});
  EXPECT_EQ(sink.producers(), 0u);
}

TEST(KafkaSinkNoBroker, DestroyWithMessagesInFlightIsQuick) {
  const int64_t t0 = now_ms();
  {
    KafkaSink sink;
    PipelineHandler h;
    h.key = 9;
    h.name = "nowhere";
    h.target = "kafka://127.0.0.1:1/t";
    h.options.timeout_ms = 60000;
    sink.set_handler_limit(9, 100);
    for (int i = 1; i <= 50; i++) ASSERT_TRUE(sink.submit(h, message(i, "k", i, "1"), 0, nullptr));
    EXPECT_EQ(sink.in_flight(9), 50u);
  }
  EXPECT_LT(now_ms() - t0, 3000);
}

TEST(KafkaSinkNoBroker, AProducerThatCannotBeMadeIsARetryNotADeadLetter) {
  KafkaSink sink;
  PipelineHandler h;
  h.key = 3;
  h.name = "bad";
  h.target = "kafka://127.0.0.1:1/t";
  // Valid for librdkafka's conf_set, refused when the producer is made.
  h.options.producer = {{"security.protocol", "ssl"}, {"ssl.ca.location", "/nonexistent/ca.pem"}};
  std::string why;
  EXPECT_TRUE(sink.submit(h, message(1, "k", 1, "1"), 0, &why));
  struct pollfd p = {sink.wait_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 1000), 1) << "the result wakes the loop";
  auto r = sink.take_results();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].outcome, HttpOutcome::Retry);
  EXPECT_NE(r[0].error.find("kafka producer could not be created"), std::string::npos) << r[0].error;
  EXPECT_EQ(sink.in_flight(), 0u);
  const Completion c = classify_result(h, r[0], 1, 7);
  EXPECT_EQ(c.outcome, CompletionOutcome::Retry);
}

TEST_F(KafkaSinkBroker, PipelinedRunOfAKeyInOrderResultsInProduceOrder) {
  const std::string topic = unique_topic("window");
  create_topic(topic, 3, {});
  KafkaSink sink;
  sink.set_pipelined(true);
  PipelineHandler h = handler_for(topic);
  h.options.key_window = 200;
  sink.set_handler_limit(h.key, 1000);
  for (int i = 1; i <= 200; i++) ASSERT_TRUE(sink.submit(h, message(i, "hot", i, std::to_string(i)), 0, nullptr));
  EXPECT_EQ(sink.in_flight(h.key), 200u) << "a run goes out without waiting for acknowledgements";
  EXPECT_GE(sink.next_deadline_in_ms(), 0) << "self-timed: the host polls by the deadline";
  auto r = wait_results(sink, 200);
  ASSERT_EQ(r.size(), 200u);
  for (size_t i = 0; i < r.size(); i++) {
    EXPECT_EQ(r[i].tag, i + 1) << "results of a key come out in produce order";
    EXPECT_EQ(r[i].outcome, HttpOutcome::Success) << r[i].error;
  }
  EXPECT_EQ(sink.next_deadline_in_ms(), -1);
  const auto got = consume(topic, 3, 200);
  ASSERT_EQ(got.size(), 200u);
  for (size_t i = 0; i < got.size(); i++) EXPECT_EQ(got[i].headers.at("relay-seq"), std::to_string(i + 1));
}

TEST_F(KafkaSinkBroker, APermanentFailureInsideAWindowIsLoggedWithTheLaterOnesAcknowledgedAfterIt) {
  const std::string topic = unique_topic("window-small");
  create_topic(topic, 1, {{"max.message.bytes", "1000"}});
  KafkaSink sink;
  sink.set_pipelined(true);
  PipelineHandler h = handler_for(topic);
  h.options.key_window = 10;
  h.options.producer = {{"batch.size", "1000"}};
  sink.set_handler_limit(h.key, 100);
  const std::string big = "\"" + std::string(5000, 'x') + "\"";
  for (int i = 1; i <= 5; i++)
    ASSERT_TRUE(sink.submit(h, message(i, "k", i, i == 3 ? big : std::to_string(i)), 0, nullptr));
  auto r = wait_results(sink, 5);
  ASSERT_EQ(r.size(), 5u);
  for (size_t i = 0; i < r.size(); i++) {
    EXPECT_EQ(r[i].tag, i + 1);
    EXPECT_EQ(r[i].outcome, i == 2 ? HttpOutcome::Fail : HttpOutcome::Success) << r[i].error;
    EXPECT_EQ(r[i].after_gap, i > 2) << "seq " << i + 1 << ": only the ones acknowledged after the gap";
  }
  bool logged = false;
  for (const auto& line : sink.take_log())
    if (line.find("delivery 3 (seq 3) failed") != std::string::npos &&
        line.find("2 later message(s) of the key") != std::string::npos)
      logged = true;
  EXPECT_TRUE(logged) << "the failure and the later messages acknowledged after it are logged";
  const auto got = consume(topic, 1, 4);
  ASSERT_EQ(got.size(), 4u);
  const char* seqs[] = {"1", "2", "4", "5"};
  for (size_t i = 0; i < got.size(); i++) EXPECT_EQ(got[i].headers.at("relay-seq"), seqs[i]);
}

namespace {

// A handler with a window whose broker never answers (nothing listens on port 1).
PipelineHandler unreachable_windowed(KafkaSink& sink, int key) {
  PipelineHandler h;
  h.key = key;
  h.name = "unreachable";
  h.target = "kafka://127.0.0.1:1/t";
  h.options.timeout_ms = 300;
  h.options.key_window = 8;
  sink.set_handler_limit(h.key, 100);
  return h;
}

}  // namespace

TEST(KafkaSinkNoBroker, PipelinedMessagesOlderThanTheTimeoutFailTogetherAndTheProducerIsReplaced) {
  KafkaSink sink;
  sink.set_pipelined(true);
  const PipelineHandler h = unreachable_windowed(sink, 4);
  for (int i = 1; i <= 8; i++) ASSERT_TRUE(sink.submit(h, message(i, "k", i, "1"), 0, nullptr));
  ASSERT_TRUE(sink.submit(h, message(9, "", 0, "1"), 0, nullptr));
  EXPECT_EQ(sink.producers(), 1u);
  const int64_t left = sink.next_deadline_in_ms();
  EXPECT_GE(left, 0);
  EXPECT_LE(left, 300);
  // Nothing comes by the fd before the deadline: librdkafka never times
  // them out itself (message.timeout.ms = 0), the timer does.
  std::vector<HttpResult> r;
  const int64_t t0 = now_ms();
  while (r.size() < 9 && now_ms() - t0 < 10000) {
    ::poll(nullptr, 0, static_cast<int>(std::max<int64_t>(1, sink.next_deadline_in_ms())));
    for (auto& x : sink.take_results()) r.push_back(std::move(x));
  }
  ASSERT_EQ(r.size(), 9u);
  EXPECT_GE(now_ms() - t0, 250);
  std::vector<uint64_t> keyed;
  for (const auto& x : r) {
    EXPECT_EQ(x.outcome, HttpOutcome::Retry);
    EXPECT_NE(x.error.find("purged and replaced"), std::string::npos) << x.error;
    if (x.tag != 9) keyed.push_back(x.tag);
  }
  EXPECT_EQ(keyed, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(sink.producers(), 0u) << "the producer is gone; the next message makes a new one";
  EXPECT_EQ(sink.in_flight(), 0u);
  EXPECT_EQ(sink.next_deadline_in_ms(), -1);
}

TEST(KafkaSinkNoBroker, APipelinedProducerThatFailsFatallyFailsItsMessagesInOrderAndIsReplaced) {
  KafkaSink sink;
  sink.set_pipelined(true);
  PipelineHandler h = unreachable_windowed(sink, 6);
  h.options.timeout_ms = 60000;  // the fatal error, not the timeout, ends them
  for (int i = 1; i <= 8; i++) ASSERT_TRUE(sink.submit(h, message(i, "k", i, "1"), 0, nullptr));
  rd_kafka_t* first = sink.producer_of(h.key);
  ASSERT_NE(first, nullptr);
  // librdkafka's own way to raise a fatal error (as an idempotence failure would).
  ASSERT_EQ(rd_kafka_test_fatal_error(first, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, "injected"),
            RD_KAFKA_RESP_ERR_NO_ERROR);
  std::vector<HttpResult> r;
  const int64_t t0 = now_ms();
  while (r.size() < 8 && now_ms() - t0 < 10000) {
    for (auto& x : sink.take_results()) r.push_back(std::move(x));
    ::poll(nullptr, 0, 20);
  }
  ASSERT_EQ(r.size(), 8u);
  for (size_t i = 0; i < r.size(); i++) {
    EXPECT_EQ(r[i].tag, i + 1) << "in produce order";
    EXPECT_EQ(r[i].outcome, HttpOutcome::Retry) << r[i].error;
  }
  EXPECT_EQ(sink.producers(), 0u);
  EXPECT_EQ(sink.next_deadline_in_ms(), -1) << "nothing points at the destroyed producer";
  ASSERT_TRUE(sink.submit(h, message(9, "k", 9, "1"), 0, nullptr));
  EXPECT_EQ(sink.producers(), 1u) << "the next message makes a new producer";
}

TEST(KafkaSinkNoBroker, NotPipelinedKeepsLibrdkafkasTimeout) {
  KafkaSink sink;  // the sidecar's mode
  const PipelineHandler h = unreachable_windowed(sink, 5);
  ASSERT_TRUE(sink.submit(h, message(1, "k", 1, "1"), 0, nullptr));
  EXPECT_EQ(sink.next_deadline_in_ms(), -1);
  auto r = wait_results(sink, 1, 10000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].outcome, HttpOutcome::Retry);
  EXPECT_NE(r[0].error.find("_MSG_TIMED_OUT"), std::string::npos) << r[0].error;
}
