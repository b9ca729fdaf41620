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
#include <string>

namespace {

int fail(const char* what, const char* detail) {
  std::fprintf(stderr, "kafka_topic: %s: %s\n", what, detail);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: kafka_topic BOOTSTRAP TOPIC PARTITIONS [NAME=VALUE...]\n");
    return 2;
  }
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", argv[1], err, sizeof err) != RD_KAFKA_CONF_OK)
    return fail("bootstrap.servers", err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) return fail("client", err);

  rd_kafka_NewTopic_t* topic = rd_kafka_NewTopic_new(argv[2], std::atoi(argv[3]), 1, err, sizeof err);
  if (topic == nullptr) return fail("topic", err);
  for (int i = 4; i < argc; i++) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq == nullptr) return fail("config (want NAME=VALUE)", argv[i]);
    std::string name(argv[i], eq - argv[i]);
    if (rd_kafka_NewTopic_set_config(topic, name.c_str(), eq + 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
      return fail("config", argv[i]);
  }

  rd_kafka_queue_t* queue = rd_kafka_queue_new(rk);
  rd_kafka_AdminOptions_t* options = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
  rd_kafka_AdminOptions_set_operation_timeout(options, 30000, err, sizeof err);
  rd_kafka_AdminOptions_set_request_timeout(options, 60000, err, sizeof err);
  rd_kafka_CreateTopics(rk, &topic, 1, options, queue);

  rd_kafka_event_t* event = rd_kafka_queue_poll(queue, 90000);
  int rc = 0;
  if (event == nullptr) {
    rc = fail("create", "no answer within 90 s");
  } else if (rd_kafka_event_error(event) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    rc = fail("create", rd_kafka_event_error_string(event));
  } else {
    size_t n = 0;
    const rd_kafka_topic_result_t** results =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event), &n);
    if (n != 1) {
      rc = fail("create", "no result for the topic");
    } else if (rd_kafka_topic_result_error(results[0]) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      rc = fail(argv[2], rd_kafka_topic_result_error_string(results[0]));
    }
  }
  if (event != nullptr) rd_kafka_event_destroy(event);
  rd_kafka_AdminOptions_destroy(options);
  rd_kafka_NewTopic_destroy(topic);
  rd_kafka_queue_destroy(queue);
  rd_kafka_destroy(rk);
  return rc;
}
