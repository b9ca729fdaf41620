// Creates a Kafka topic through librdkafka's admin API, for the integration
// tests (kafka_lib.sh's kafka_create_topic): what Kafka's TopicCommand does,
// without starting a JVM for it.
//
//     kafka_topic BOOTSTRAP TOPIC PARTITIONS [NAME=VALUE...]
//
// The topic gets replication factor 1 and the given topic configs. Exits 0
// once the controller has created it, 1 with the broker's error on stderr
// otherwise (an existing topic included).
#include <librdkafka/rdkafka.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

int fail(const char* what, const char* detail) {
  std::fprintf(stderr, "kafka_topic: %s: %s\n", what, detail);
  return 1;
}

// Each librdkafka handle freed by its own destroy function, on every return.
template <typename T, void (*Destroy)(T*)>
struct Destroyer {
  void operator()(T* p) const { Destroy(p); }
};
template <typename T, void (*Destroy)(T*)>
using Owned = std::unique_ptr<T, Destroyer<T, Destroy>>;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: kafka_topic BOOTSTRAP TOPIC PARTITIONS [NAME=VALUE...]\n");
    return 2;
  }
  char err[512];
  Owned<rd_kafka_conf_t, rd_kafka_conf_destroy> conf(rd_kafka_conf_new());
  if (rd_kafka_conf_set(conf.get(), "bootstrap.servers", argv[1], err, sizeof err) != RD_KAFKA_CONF_OK)
    return fail("bootstrap.servers", err);
  // rd_kafka_new takes the configuration over only when it succeeds.
  Owned<rd_kafka_t, rd_kafka_destroy> rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), err, sizeof err));
  if (rk == nullptr) return fail("client", err);
  conf.release();

  Owned<rd_kafka_NewTopic_t, rd_kafka_NewTopic_destroy> topic(
      rd_kafka_NewTopic_new(argv[2], std::atoi(argv[3]), 1, err, sizeof err));
  if (topic == nullptr) return fail("topic", err);
  for (int i = 4; i < argc; i++) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq == nullptr) return fail("config (want NAME=VALUE)", argv[i]);
    std::string name(argv[i], eq - argv[i]);
    if (rd_kafka_NewTopic_set_config(topic.get(), name.c_str(), eq + 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
      return fail("config", argv[i]);
  }

  Owned<rd_kafka_queue_t, rd_kafka_queue_destroy> queue(rd_kafka_queue_new(rk.get()));
  Owned<rd_kafka_AdminOptions_t, rd_kafka_AdminOptions_destroy> options(
      rd_kafka_AdminOptions_new(rk.get(), RD_KAFKA_ADMIN_OP_CREATETOPICS));
  rd_kafka_AdminOptions_set_operation_timeout(options.get(), 30000, err, sizeof err);
  rd_kafka_AdminOptions_set_request_timeout(options.get(), 60000, err, sizeof err);
  rd_kafka_NewTopic_t* topics[] = {topic.get()};
  rd_kafka_CreateTopics(rk.get(), topics, 1, options.get(), queue.get());

  Owned<rd_kafka_event_t, rd_kafka_event_destroy> event(rd_kafka_queue_poll(queue.get(), 90000));
  if (event == nullptr) return fail("create", "no answer within 90 s");
  if (rd_kafka_event_error(event.get()) != RD_KAFKA_RESP_ERR_NO_ERROR)
    return fail("create", rd_kafka_event_error_string(event.get()));
  size_t n = 0;
  const rd_kafka_topic_result_t** results =
      rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event.get()), &n);
  if (n != 1) return fail("create", "no result for the topic");
  if (rd_kafka_topic_result_error(results[0]) != RD_KAFKA_RESP_ERR_NO_ERROR)
    return fail(argv[2], rd_kafka_topic_result_error_string(results[0]));
  return 0;
}
