#pragma once

// Kafka as a delivery sink: the pipeline's deliveries of kafka handlers go out
// through librdkafka, one idempotent producer (enable.idempotence, acks=all)
// per handler. Nothing here blocks: messages are produced without
// RD_KAFKA_MSG_F_BLOCK, delivery reports wait in each producer's main queue,
// whose io event writes a byte to one pipe (wait_fd). The host's loop waits on
// that fd with its other sockets and calls poll(), which serves the queues
// with timeout 0 on the loop's thread: librdkafka's own threads only write the
// fd and never run relaybus code. No PostgreSQL or MongoDB here.
//
// Message: topic from the handler's target; key = the ordering key (none for
// an unkeyed event); value = the payload's JSON text, or the webhook envelope
// with "envelope": true; headers relay-id (delivery id: the consumer's de-dup
// key), relay-event-id, relay-topic, relay-seq and relay-key (keyed events),
// relay-attempt, relay-published-at, then the event's own headers (string
// values). docs/kafka.md describes it.
//
// Pipelined (a mode its host turns on, set_pipelined): a handler whose
// key_window is above 1 has runs of a key in flight at once. librdkafka then
// never times a message out (message.timeout.ms = 0): a timed-out message
// that was still queued would be skipped while the key's later ones go out.
// The sink enforces the handler's timeout itself instead: once a message is
// older than it, the whole producer is purged and destroyed and every
// message it held fails as a Retry, so the retried run follows complete
// copies (duplicates, never a reordering). The host must then call poll() by
// next_deadline_in_ms() too, not only when wait_fd() is readable. A key's
// results come out in the order its messages were produced.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "delivery_pipeline.hpp"
#include "kafka_config.hpp"

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_message_s rd_kafka_message_t;

namespace relaybus::core {

// Whether librdkafka's error code (rd_kafka_resp_err_t) fails a message for
// good: too large, topic unknown or invalid, not authorized, corrupt record.
// Such a result is HttpOutcome::Fail (dead letter at once); anything else is
// a Retry with the handler's backoff.
bool kafka_error_is_permanent(int err);

class KafkaSink final : public DeliverySink {
 public:
  KafkaSink();
  // Purges what is queued or in flight and waits at most about 200 ms per
  // producer for it to stop: never blocks the host for long.
  ~KafkaSink() override;
  KafkaSink(const KafkaSink&) = delete;
  KafkaSink& operator=(const KafkaSink&) = delete;

  bool ok() const { return pipe_[0] >= 0; }
  void set_pipelined(bool on) { pipelined_ = on; }
  // Milliseconds until the earliest pipelined message is due to time out
  // (0: overdue), -1: none waits.
  int64_t next_deadline_in_ms() const;

  void set_handler_limit(int key, int concurrency) override;
  bool can_submit(int key) const override;
  size_t in_flight() const override { return pending_.size(); }
  size_t in_flight(int key) const override;
  // Produces the message now. The producer of the handler is made on its
  // first message, and again when its target or options changed. Always
  // true: a message librdkafka refuses at once (too large, queue full) still
  // comes back as a result, and so does one whose producer could not be made
  // (a Retry with librdkafka's reason).
  bool submit(const PipelineHandler& handler, const WebhookMessage& message, int64_t now_ms, std::string* why) override;
  std::vector<HttpResult> take_results() override;
  // Forgets every message in flight (no result comes for them) and purges them.
  void cancel_all() override;

  // Readable when delivery reports (or other events) wait: the host's loop
  // waits on it, then calls poll().
  int wait_fd() const { return pipe_[0]; }
  // Serves every producer's queue without blocking: delivery reports become
  // results (take_results), errors and logs become messages (take_log).
  void poll();
  // Closes the producers of handlers not in keys (gone or no longer kafka).
  void retain_handlers(const std::vector<int>& keys);
  // librdkafka's log and error lines since the last call, for the host's log.
  std::vector<std::string> take_log();
  size_t producers() const { return producers_.size(); }
  // The handler's current producer, or nullptr (for diagnostics and tests).
  rd_kafka_t* producer_of(int key) const {
    auto it = producers_.find(key);
    return it == producers_.end() ? nullptr : it->second.rk;
  }

  // Called by librdkafka's callbacks (on the loop's thread, inside poll()).
  void on_delivery(const rd_kafka_message_t* m);
  void on_log(std::string line);

 private:
  struct Producer {
    rd_kafka_t* rk = nullptr;
    std::string fingerprint;  // target and options it was made with
    std::string topic;
  };
  struct Pending {
    uint64_t tag = 0;
    int key = 0;
    int64_t sent_ms = 0;  // steady clock
    rd_kafka_t* rk = nullptr;
    int64_t deadline_ms = 0;  // steady clock; 0: librdkafka's message.timeout.ms times it
    std::string order_key;    // non-empty: results of this key come out in produce order
    int64_t seq = 0;
  };
  // The run of one key in flight: serials in produce order, the results
  // that wait for an earlier one, and what failed in it.
  struct KeyRun {
    std::string handler;
    std::vector<uint64_t> serials;
    size_t next = 0;
    std::unordered_map<uint64_t, HttpResult> done;
    std::string failed;  // the first failure's description, empty: none
    bool failed_for_good = false;
    int acknowledged_after = 0;  // later messages acknowledged after that failure
  };
  Producer* producer_for(const PipelineHandler& h, std::string* why);
  void retire(Producer p);
  void destroy(rd_kafka_t* rk);
  void complete(uint64_t serial, HttpResult r);
  void release_in_order(const std::string& order_key, KeyRun& run);
  // Fails every message of rk as a Retry (why) and destroys it: its messages
  // after the first missing one can never land before that one's retry.
  void abandon(rd_kafka_t* rk, const std::string& why);
  void abandon_marked();
  void wake();

  int pipe_[2] = {-1, -1};
  std::unordered_map<int, Producer> producers_;
  std::vector<rd_kafka_t*> retired_;  // replaced producers, until their messages are done
  std::unordered_map<int, int> limit_;
  std::unordered_map<int, int> in_flight_of_;
  std::unordered_map<uint64_t, Pending> pending_;  // serial (the message's opaque) -> delivery
  uint64_t next_serial_ = 1;
  std::vector<HttpResult> results_;
  std::vector<std::string> log_;
  bool pipelined_ = false;
  std::unordered_map<std::string, KeyRun> runs_;  // Pending::order_key -> its run
  std::vector<rd_kafka_t*> to_abandon_;           // marked inside librdkafka's callbacks
};

}  // namespace relaybus::core
