#include "kafka_sink.hpp"

#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "cloudevents.hpp"
#include "webhook_delivery.hpp"

namespace relaybus::core {

namespace {

constexpr size_t kMaxLogLines = 200;
constexpr int kDestroyFlushMs = 200;

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

KafkaSink* sink_of(void* opaque) { return static_cast<KafkaSink*>(opaque); }

void dr_msg_cb(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  try {
    sink_of(opaque)->on_delivery(m);
  } catch (...) {
    // Nothing may unwind into librdkafka; a lost report is a retry later
    // (the delivery's lease runs out).
  }
}

void log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
  try {
    // Notice and above (debug chatter stays out of the server log); FAIL
    // lines repeat what error_cb reports.
    if (level > 5 || std::string_view(fac) == "FAIL") return;
    sink_of(rd_kafka_opaque(rk))->on_log(std::string("kafka ") + rd_kafka_name(rk) + " " + fac + ": " + buf);
  } catch (...) {
  }
}

void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
  try {
    sink_of(opaque)->on_log(std::string("kafka ") + rd_kafka_name(rk) + " error " +
                            rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err)) + ": " + reason);
  } catch (...) {
  }
}

std::string kafka_error_text(rd_kafka_resp_err_t err) {
  return std::string("kafka: ") + rd_kafka_err2str(err) + " (" + rd_kafka_err2name(err) + ")";
}

// The sink times the handler's messages itself (KafkaSink::set_pipelined)
// when a key has more than one of them out: the one key_window rule, every
// handler here being a kafka one.
bool self_timed(bool pipelined, const PipelineHandler& h) {
  return pipelined && effective_key_window(HandlerKind::Kafka, h.options) > 1;
}

std::string fingerprint_of(const PipelineHandler& h, bool self_timed) {
  std::string f = h.target;
  f += '\n';
  f += self_timed ? "self-timed " : "";
  f += std::to_string(h.options.timeout_ms);
  for (const auto& kv : h.options.producer) {
    f += '\n';
    f += kv.first;
    f += '=';
    f += kv.second;
  }
  return f;
}

bool conf_set(rd_kafka_conf_t* conf, const std::string& name, const std::string& value, std::string* why) {
  char err[512] = "";
  if (rd_kafka_conf_set(conf, name.c_str(), value.c_str(), err, sizeof err) == RD_KAFKA_CONF_OK) return true;
  if (why) *why = "kafka producer property \"" + name + "\": " + err;
  return false;
}

void add_header(rd_kafka_headers_t* hdrs, const char* name, const std::string& value) {
  rd_kafka_header_add(hdrs, name, -1, value.data(), static_cast<ssize_t>(value.size()));
}

}  // namespace

bool kafka_error_is_permanent(int code) {
  switch (static_cast<rd_kafka_resp_err_t>(code)) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
      return true;
    default:
      return false;
  }
}

KafkaSink::KafkaSink() {
  if (pipe2(pipe_, O_NONBLOCK | O_CLOEXEC) != 0) pipe_[0] = pipe_[1] = -1;
}

KafkaSink::~KafkaSink() {
  pending_.clear();  // reports served while closing find nothing to complete
  for (auto& kv : producers_) destroy(kv.second.rk);
  for (rd_kafka_t* rk : retired_) destroy(rk);
  if (pipe_[0] >= 0) close(pipe_[0]);
  if (pipe_[1] >= 0) close(pipe_[1]);
}

void KafkaSink::destroy(rd_kafka_t* rk) {
  // Bounded: what is still queued or in flight is purged (its deliveries are
  // sent again by whoever holds them next), then librdkafka gets a moment to
  // hand the purge reports back before it is torn down.
  rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING);
  rd_kafka_flush(rk, kDestroyFlushMs);
  rd_kafka_destroy(rk);
}

void KafkaSink::set_handler_limit(int key, int concurrency) { limit_[key] = std::max(1, concurrency); }

bool KafkaSink::can_submit(int key) const {
  auto l = limit_.find(key);
  const int limit = l == limit_.end() ? 1 : l->second;
  return static_cast<int>(in_flight(key)) < limit;
}

size_t KafkaSink::in_flight(int key) const {
  auto it = in_flight_of_.find(key);
  return it == in_flight_of_.end() ? 0 : static_cast<size_t>(it->second);
}

KafkaSink::Producer* KafkaSink::producer_for(const PipelineHandler& h, std::string* why) {
  const bool own_timeout = self_timed(pipelined_, h);
  const std::string fp = fingerprint_of(h, own_timeout);
  abandon_marked();
  auto it = producers_.find(h.key);
  if (it != producers_.end()) {
    if (it->second.fingerprint == fp) return &it->second;
    // The handler changed: the old producer finishes what it has in flight
    // (poll() serves it until then) and a new one takes the next messages.
    retire(std::move(it->second));
    producers_.erase(it);
  }
  KafkaTarget target;
  if (!parse_kafka_target(h.target, &target, why)) return nullptr;
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  // Waiting to fill a batch (librdkafka's 5 ms) only delays a key that has
  // one message in flight at a time; a pipelined run still batches, as its
  // messages queue behind the requests in flight. murmur2_random puts a key where
  // Kafka's Java client (so Kafka Streams, ksqlDB, Flink, Spring) would:
  // consumers that co-partition by key rely on it; librdkafka's own default
  // (CRC32) disagrees for most keys. The handler may say otherwise for both.
  bool ok = conf_set(conf, "linger.ms", "0", why) && conf_set(conf, "partitioner", "murmur2_random", why) &&
            conf_set(conf, "client.id", "relaybus-" + h.name, why);
  for (const auto& kv : h.options.producer) {
    if (!ok) break;
    if (!validate_kafka_property(kv.first, kv.second, why) || !conf_set(conf, kv.first, kv.second, why)) {
      ok = false;
      break;
    }
  }
  ok = ok && conf_set(conf, "bootstrap.servers", target.bootstrap, why) &&
       conf_set(conf, "enable.idempotence", "true", why) && conf_set(conf, "acks", "all", why) &&
       conf_set(conf, "message.timeout.ms",
                own_timeout ? std::string("0") : std::to_string(std::max<int64_t>(1, h.options.timeout_ms)), why) &&
       conf_set(conf, "log.queue", "true", why);
  if (!ok) {
    rd_kafka_conf_destroy(conf);
    return nullptr;
  }
  rd_kafka_conf_set_opaque(conf, this);
  rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);
  rd_kafka_conf_set_log_cb(conf, log_cb);
  rd_kafka_conf_set_error_cb(conf, error_cb);
  char err[512] = "";
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) {
    rd_kafka_conf_destroy(conf);  // still ours when rd_kafka_new fails
    if (why) *why = std::string("kafka producer could not be created: ") + err;
    return nullptr;
  }
  rd_kafka_set_log_queue(rk, nullptr);  // logs are served by poll(), on the loop's thread
  rd_kafka_queue_t* main_queue = rd_kafka_queue_get_main(rk);
  static const char kByte[1] = {'k'};
  rd_kafka_queue_io_event_enable(main_queue, pipe_[1], kByte, 1);
  rd_kafka_queue_destroy(main_queue);
  Producer p;
  p.rk = rk;
  p.fingerprint = fp;
  p.topic = target.topic;
  return &(producers_[h.key] = std::move(p));
}

void KafkaSink::retire(Producer p) {
  if (p.rk) retired_.push_back(p.rk);
}

bool KafkaSink::submit(const PipelineHandler& h, const WebhookMessage& m, int64_t now_ms, std::string* why) {
  (void)why;
  std::string no_producer;
  Producer* p = producer_for(h, &no_producer);
  if (!p) {
    // The handler's configuration passed its checks but librdkafka would not
    // make a producer of it (a TLS file missing, say): an attempt that failed
    // and is retried with backoff, not a dead letter, so that fixing the
    // handler (or the file) lets its deliveries go on.
    const uint64_t serial = next_serial_++;
    Pending failed;
    failed.tag = static_cast<uint64_t>(m.id);
    failed.key = h.key;
    failed.sent_ms = steady_ms();
    pending_[serial] = std::move(failed);
    in_flight_of_[h.key]++;
    HttpResult r;
    r.outcome = HttpOutcome::Retry;
    r.error = no_producer;
    complete(serial, std::move(r));
    wake();
    return true;
  }
  std::string value;
  CloudEventMessage ce;
  if (h.options.cloudevents != CloudEventsMode::Off) {
    ce = make_cloudevent(h.options, m, CloudEventsBinding::Kafka);
    value = std::move(ce.body);
  } else if (h.options.envelope) {
    value = webhook_envelope_json(m.id, m.event_id, m.topic, m.has_key ? &m.key : nullptr,
                                  m.has_key ? std::optional<int64_t>(m.seq) : std::nullopt, m.published_at_ms,
                                  m.attempt, m.headers_json, m.payload_json);
  }
  const bool own_value = h.options.envelope || h.options.cloudevents != CloudEventsMode::Off;
  const std::string& body = own_value ? value : m.payload_json;

  rd_kafka_headers_t* hdrs = rd_kafka_headers_new(8 + ce.headers.size());
  for (const auto& kv : ce.headers) add_header(hdrs, kv.first.c_str(), kv.second);
  add_header(hdrs, "relay-id", std::to_string(m.id));
  add_header(hdrs, "relay-event-id", std::to_string(m.event_id));
  add_header(hdrs, "relay-topic", m.topic);
  if (m.has_key) {
    add_header(hdrs, "relay-key", m.key);
    add_header(hdrs, "relay-seq", std::to_string(m.seq));
  }
  add_header(hdrs, "relay-attempt", std::to_string(m.attempt));
  if (m.published_at_ms > 0) add_header(hdrs, "relay-published-at", format_rfc3339_ms(m.published_at_ms));
  if (m.trace.present()) {
    add_header(hdrs, "traceparent", m.trace.traceparent);
    if (!m.trace.tracestate.empty()) add_header(hdrs, "tracestate", m.trace.tracestate);
  }
  if (!m.headers_json.empty()) {
    const auto j = nlohmann::json::parse(m.headers_json, nullptr, false);
    if (j.is_object()) {
      for (const auto& item : j.items()) {
        // relay-* are relaybus's: a publisher cannot forge a delivery id.
        if (!item.value().is_string() || item.key().rfind("relay-", 0) == 0) continue;
        // Nor a CloudEvent's attributes.
        if (!ce.headers.empty() && (item.key().rfind("ce_", 0) == 0 || item.key() == "content-type")) continue;
        // The stored trace context goes out as this attempt's span (above).
        if (item.key() == "traceparent" || item.key() == "tracestate") continue;
        const std::string& v = item.value().get_ref<const std::string&>();
        rd_kafka_header_add(hdrs, item.key().data(), static_cast<ssize_t>(item.key().size()), v.data(),
                            static_cast<ssize_t>(v.size()));
      }
    }
  }

  const uint64_t serial = next_serial_++;
  Pending pending;
  pending.tag = static_cast<uint64_t>(m.id);
  pending.key = h.key;
  pending.sent_ms = steady_ms();
  pending.rk = p->rk;
  pending.seq = m.seq;
  if (self_timed(pipelined_, h)) {
    pending.deadline_ms = pending.sent_ms + std::max<int64_t>(1, h.options.timeout_ms);
    if (m.has_key) {
      pending.order_key = std::to_string(h.key) + '\n' + m.key;
      KeyRun& run = runs_[pending.order_key];
      run.handler = h.name;
      run.serials.push_back(serial);
    }
  }
  pending_[serial] = std::move(pending);
  (void)now_ms;
  in_flight_of_[h.key]++;
  const rd_kafka_resp_err_t err =
      rd_kafka_producev(p->rk, RD_KAFKA_V_TOPIC(p->topic.c_str()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_KEY(m.has_key ? m.key.data() : nullptr, m.has_key ? m.key.size() : 0),
                        RD_KAFKA_V_VALUE(const_cast<char*>(body.data()), body.size()), RD_KAFKA_V_HEADERS(hdrs),
                        RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(serial)), RD_KAFKA_V_END);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    rd_kafka_headers_destroy(hdrs);  // not taken over on failure
    // Refused at once (too large for message.max.bytes, local queue full):
    // a result like any other, classified the same way.
    HttpResult r;
    r.outcome = kafka_error_is_permanent(err) ? HttpOutcome::Fail : HttpOutcome::Retry;
    r.error = kafka_error_text(err);
    const bool own = !pending_[serial].order_key.empty() || pending_[serial].deadline_ms != 0;
    complete(serial, std::move(r));
    // A later message of the key must not go out through this producer
    // before this one's retry.
    if (own && !kafka_error_is_permanent(err)) abandon(p->rk, kafka_error_text(err) + ", its producer replaced");
    wake();
  }
  return true;
}

void KafkaSink::complete(uint64_t serial, HttpResult r) {
  auto it = pending_.find(serial);
  if (it == pending_.end()) return;  // cancelled meanwhile
  r.tag = it->second.tag;
  r.handler_key = it->second.key;
  r.elapsed_ms = steady_ms() - it->second.sent_ms;
  r.status = 0;
  auto f = in_flight_of_.find(it->second.key);
  if (f != in_flight_of_.end() && --f->second <= 0) in_flight_of_.erase(f);
  const std::string order_key = std::move(it->second.order_key);
  const int64_t seq = it->second.seq;
  pending_.erase(it);
  if (order_key.empty()) {
    results_.push_back(std::move(r));
    return;
  }
  auto run = runs_.find(order_key);
  if (run == runs_.end()) return;
  if (r.outcome != HttpOutcome::Success && run->second.failed.empty()) {
    run->second.failed = "delivery " + std::to_string(r.tag) + " (seq " + std::to_string(seq) + ") failed: " + r.error;
    run->second.failed_for_good = r.outcome == HttpOutcome::Fail;
  }
  run->second.done.emplace(serial, std::move(r));
  release_in_order(order_key, run->second);
}

void KafkaSink::release_in_order(const std::string& order_key, KeyRun& run) {
  // Results are handed on in produce order, so that a key's completions
  // commit in seq order: a crash between two completing transactions then
  // never leaves an earlier delivery of the key to be produced again after
  // a later one was taken as done.
  while (run.next < run.serials.size()) {
    auto d = run.done.find(run.serials[run.next]);
    if (d == run.done.end()) return;
    if (d->second.outcome == HttpOutcome::Success && !run.failed.empty()) {
      run.acknowledged_after++;
      d->second.after_gap = true;
    }
    results_.push_back(std::move(d->second));
    run.done.erase(d);
    run.next++;
  }
  if (run.failed_for_good || run.acknowledged_after > 0) {
    // Later messages of the key acknowledged after a failed one are in the
    // partition after the gap: a failure for good (the broker refused the
    // message) lets them through; a retried one should not (the producer is
    // replaced at once) but is counted if it did.
    const size_t at = order_key.find('\n');
    on_log("kafka handler " + run.handler + ", key \"" + order_key.substr(at + 1) + "\": " + run.failed + "; " +
           std::to_string(run.acknowledged_after) +
           " later message(s) of the key in flight with it were acknowledged after it (in the partition after the "
           "gap)");
  }
  runs_.erase(order_key);
}

void KafkaSink::abandon(rd_kafka_t* rk, const std::string& why) {
  std::vector<uint64_t> serials;
  for (const auto& kv : pending_)
    if (kv.second.rk == rk) serials.push_back(kv.first);
  // In produce order (serials grow), so each key's run is released whole.
  std::sort(serials.begin(), serials.end());
  for (uint64_t serial : serials) {
    HttpResult r;
    r.outcome = HttpOutcome::Retry;
    r.error = why;
    complete(serial, std::move(r));
  }
  for (auto it = producers_.begin(); it != producers_.end(); ++it)
    if (it->second.rk == rk) {
      on_log(std::string("kafka ") + rd_kafka_name(rk) + ": purged and replaced, " + std::to_string(serials.size()) +
             " message(s) to be retried: " + why);
      producers_.erase(it);
      break;
    }
  retired_.erase(std::remove(retired_.begin(), retired_.end(), rk), retired_.end());
  to_abandon_.erase(std::remove(to_abandon_.begin(), to_abandon_.end(), rk), to_abandon_.end());
  destroy(rk);  // its purge reports find nothing left to complete
  wake();
}

void KafkaSink::abandon_marked() {
  while (!to_abandon_.empty()) abandon(to_abandon_.front(), "kafka: a message of the producer failed");
}

int64_t KafkaSink::next_deadline_in_ms() const {
  int64_t first = 0;
  for (const auto& kv : pending_)
    if (kv.second.deadline_ms != 0 && (first == 0 || kv.second.deadline_ms < first)) first = kv.second.deadline_ms;
  if (first == 0) return -1;
  return std::max<int64_t>(0, first - steady_ms());
}

void KafkaSink::on_delivery(const rd_kafka_message_t* m) {
  const auto serial = reinterpret_cast<uint64_t>(m->_private);
  HttpResult r;
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    r.outcome = HttpOutcome::Success;
    r.kafka_partition = m->partition;
    r.kafka_offset = m->offset;
  } else {
    r.outcome = kafka_error_is_permanent(m->err) ? HttpOutcome::Fail : HttpOutcome::Retry;
    r.error = kafka_error_text(m->err);
    auto p = pending_.find(serial);
    // A self-timed message that failed without being refused for good (not
    // our own purge): the producer may go on with the key's later messages,
    // so it goes, with them. Not here: this runs inside librdkafka's poll.
    if (r.outcome == HttpOutcome::Retry && p != pending_.end() && p->second.deadline_ms != 0 &&
        m->err != RD_KAFKA_RESP_ERR__PURGE_QUEUE && m->err != RD_KAFKA_RESP_ERR__PURGE_INFLIGHT &&
        std::find(to_abandon_.begin(), to_abandon_.end(), p->second.rk) == to_abandon_.end())
      to_abandon_.push_back(p->second.rk);
  }
  complete(serial, std::move(r));
}

void KafkaSink::on_log(std::string line) {
  if (log_.size() < kMaxLogLines) log_.push_back(std::move(line));
}

std::vector<std::string> KafkaSink::take_log() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

void KafkaSink::wake() {
  if (pipe_[1] >= 0) {
    const char b = 's';
    (void)!write(pipe_[1], &b, 1);
  }
}

void KafkaSink::poll() {
  // Drained first: a report that arrives while the queues are served writes
  // the fd again.
  if (pipe_[0] >= 0) {
    char buf[256];
    while (read(pipe_[0], buf, sizeof buf) > 0) {
    }
  }
  for (auto it = producers_.begin(); it != producers_.end();) {
    rd_kafka_poll(it->second.rk, 0);
    char err[512] = "";
    const rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(it->second.rk, err, sizeof err);
    if (fatal != RD_KAFKA_RESP_ERR_NO_ERROR) {
      // An idempotent producer that hit a fatal error cannot go on: its
      // messages fail (purged: retried later) and the next one makes a new producer.
      on_log(std::string("kafka producer of handler ") + std::to_string(it->first) +
             " failed fatally, it is replaced: " + err);
      retire(std::move(it->second));
      it = producers_.erase(it);
      continue;
    }
    ++it;
  }
  for (rd_kafka_t* rk : retired_) rd_kafka_poll(rk, 0);
  abandon_marked();
  if (pipelined_) {
    const int64_t now = steady_ms();
    std::vector<rd_kafka_t*> late;
    for (const auto& kv : pending_)
      if (kv.second.deadline_ms != 0 && now >= kv.second.deadline_ms &&
          std::find(late.begin(), late.end(), kv.second.rk) == late.end())
        late.push_back(kv.second.rk);
    for (rd_kafka_t* rk : late)
      abandon(rk, "kafka: no acknowledgement within the handler's timeout; the producer was purged and replaced");
  }
  std::vector<rd_kafka_t*> done;
  for (rd_kafka_t* rk : retired_) {
    char err[8];
    if (rd_kafka_outq_len(rk) == 0 || rd_kafka_fatal_error(rk, err, sizeof err) != RD_KAFKA_RESP_ERR_NO_ERROR)
      done.push_back(rk);
  }
  for (rd_kafka_t* rk : done) {
    // Pipelined: what a fatally failed producer still held fails here, in
    // produce order, before it goes (no message may point at a destroyed one).
    if (pipelined_) {
      abandon(rk, "kafka: the producer failed fatally and was replaced");
      continue;
    }
    destroy(rk);
    retired_.erase(std::remove(retired_.begin(), retired_.end(), rk), retired_.end());
  }
}

std::vector<HttpResult> KafkaSink::take_results() {
  poll();
  std::vector<HttpResult> out;
  out.swap(results_);
  return out;
}

void KafkaSink::cancel_all() {
  pending_.clear();
  in_flight_of_.clear();
  runs_.clear();
  for (auto& kv : producers_)
    rd_kafka_purge(kv.second.rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING);
}

void KafkaSink::retain_handlers(const std::vector<int>& keys) {
  for (auto it = producers_.begin(); it != producers_.end();) {
    if (std::find(keys.begin(), keys.end(), it->first) == keys.end()) {
      retire(std::move(it->second));
      it = producers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace relaybus::core
