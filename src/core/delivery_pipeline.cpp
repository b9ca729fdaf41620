#include "delivery_pipeline.hpp"

#include <algorithm>
#include <utility>

#include "backoff.hpp"
#include "clock.hpp"

namespace relaybus::core {

namespace {

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

const char* completion_outcome_name(CompletionOutcome o) {
  switch (o) {
    case CompletionOutcome::Delivered:
      return "delivered";
    case CompletionOutcome::Retry:
      return "retry";
    case CompletionOutcome::Dead:
      return "dead";
  }
  return "?";
}

Completion classify_result(const PipelineHandler& h, const HttpResult& r, int attempt, uint64_t random64) {
  Completion c;
  c.id = static_cast<int64_t>(r.tag);
  c.handler_key = h.key;
  c.handler = h.name;
  c.status = r.status;
  c.after_gap = r.after_gap;
  if (r.outcome == HttpOutcome::Success) {
    c.outcome = CompletionOutcome::Delivered;
    return c;
  }
  c.error = r.error;
  const bool permanent = webhook_failure_is_permanent(h.options, r);
  const int64_t retry_after = clamp_retry_after_ms(r.retry_after_ms, h.options.backoff_max_ms);
  FailureDecision d = decide_failure(h.options, permanent, attempt, retry_after, random64);
  c.outcome = d.dead ? CompletionOutcome::Dead : CompletionOutcome::Retry;
  c.retry_in_ms = d.dead ? 0 : d.retry_in_ms;
  return c;
}

bool HttpSink::submit(const PipelineHandler& h, const WebhookMessage& m, int64_t now_ms, std::string* why) {
  // Made now, as it goes out: webhook-timestamp and signature are those of
  // this moment, however long the delivery was queued.
  return engine_.submit(build_webhook_request(h.options, h.target, h.key, m, now_ms / 1000), why);
}

void HttpSink::begin_submits() {
  if (!batch_) batch_ = std::make_unique<HttpEngine::Batch>();
}

DeliveryPipeline::DeliveryPipeline(DeliverySink& sink, PipelineOptions options, uint64_t seed)
    : sink_(sink), options_(options), rng_state_(seed) {
  options_.max_in_flight = std::max(1, options_.max_in_flight);
  options_.complete_batch = std::max(1, options_.complete_batch);
}

int DeliveryPipeline::room(int key, int concurrency, const HandlerOptions& limits, int64_t now_ms) {
  int r = room(key, concurrency, now_ms);
  if (!has_shared_limit(limits) || limiter_ == nullptr || r == 0) return r;
  int64_t ahead = 1 << 20;
  if (limits.max_concurrency > 0) ahead = 2 * int64_t{limits.max_concurrency};
  if (limits.rate > 0)
    ahead = std::min<int64_t>(ahead, std::max<int64_t>(effective_burst(limits), static_cast<int64_t>(limits.rate)));
  auto q = queued_of_.find(key);
  const int64_t held = static_cast<int64_t>(sink_.in_flight(key)) + (q == queued_of_.end() ? 0 : q->second);
  // Half of it free first, as room() asks of the claim-ahead, so that one claim serves many sends.
  if (ahead - held < (ahead + 1) / 2) return 0;
  return static_cast<int>(std::min<int64_t>(r, ahead - held));
}

int DeliveryPipeline::room(int key, int concurrency, int64_t now_ms) {
  concurrency = std::max(1, concurrency);
  sink_.set_handler_limit(key, concurrency);
  const int in_flight = static_cast<int>(sink_.in_flight(key));
  auto q = queued_of_.find(key);
  const int waiting = q == queued_of_.end() ? 0 : q->second;
  auto b = breakers_.find(key);
  const int limit = b == breakers_.end() ? concurrency : b->second.limit(concurrency, now_ms);
  const int ahead = limit < concurrency ? limit : 2 * concurrency + 256;
  int r = ahead - in_flight - waiting;
  if (limit == concurrency && r < ahead / 2) r = 0;
  const int global = options_.max_in_flight - static_cast<int>(sink_.in_flight()) - static_cast<int>(queue_.size());
  return std::max(0, std::min(r, global));
}

void DeliveryPipeline::enqueue(const std::shared_ptr<const PipelineHandler>& handler,
                               std::vector<ClaimedDelivery> claimed, int64_t expires_ms) {
  sink_.set_handler_limit(handler->key, std::max(1, handler->options.concurrency));
  const int64_t enqueued = monotonic_ms();
  for (auto& d : claimed) {
    held_.insert(d.message.id);
    queued_of_[handler->key]++;
    queue_.push_back(Queued{handler, std::move(d), expires_ms, enqueued});
  }
}

void DeliveryPipeline::pump(DeliveryStore& store, int64_t now_ms) {
  next_permit_ms_ = -1;
  if (queue_.empty()) return;
  // Handlers refused a permit in this pump: their later deliveries wait too
  // (claim order, hence key order), whatever another process gives back meanwhile.
  std::unordered_map<int, int> refused_permit;  // key -> deliveries that began waiting now
  std::vector<ClaimedDelivery> give_back;
  std::deque<Queued> keep;
  std::vector<std::pair<Sent, HttpResult>> refused;
  // The submits share one engine batch; the store is called only after it.
  struct Submits {
    DeliverySink& sink;
    explicit Submits(DeliverySink& s) : sink(s) { sink.begin_submits(); }
    ~Submits() { sink.end_submits(); }
  };
  std::unique_ptr<Submits> submits = std::make_unique<Submits>(sink_);
  while (!queue_.empty()) {
    Queued q = std::move(queue_.front());
    queue_.pop_front();
    const int key = q.handler->key;
    // A handler whose breaker tripped sends no more than it allows (nothing
    // while open, then one probe at a time): the rest of its queue goes back,
    // to be claimed again later.
    auto b = breakers_.find(key);
    const bool tripped = b != breakers_.end() && b->second.is_open() &&
                         static_cast<int>(sink_.in_flight(key)) >= b->second.limit(1 << 20, now_ms);
    if (now_ms > q.expires_ms || tripped || !store.still_held(q.delivery, now_ms)) {
      queued_of_[key]--;
      held_.erase(q.delivery.message.id);
      give_back.push_back(std::move(q.delivery));
      continue;
    }
    if (!sink_.can_submit(key)) {
      keep.push_back(std::move(q));
      continue;
    }
    bool permit = false;
    if (limiter_ != nullptr && has_shared_limit(q.handler->options)) {
      auto r = refused_permit.find(key);
      int64_t retry_in_ms = 1;
      if (r == refused_permit.end() && limiter_->acquire(*q.handler, now_ms, &retry_in_ms)) {
        permit = true;
      } else {
        if (r == refused_permit.end()) {
          r = refused_permit.emplace(key, 0).first;
          const int64_t at = now_ms + std::max<int64_t>(1, retry_in_ms);
          if (next_permit_ms_ < 0 || at < next_permit_ms_) next_permit_ms_ = at;
        }
        if (!q.waited) r->second++;
        q.waited = true;
        keep.push_back(std::move(q));
        continue;
      }
    }
    queued_of_[key]--;
    std::string why;
    Sent sent{q.handler, q.delivery.receipt, q.delivery.message.attempt, q.delivery.published, now_ms, permit, {}, {}};
    WebhookMessage& m = q.delivery.message;
    TraceContext stored = trace_context_from_headers(m.headers_json);
    if (stored.present()) {
      m.trace.traceparent = attempt_traceparent(stored.traceparent, splitmix64(&rng_state_));
      m.trace.tracestate = std::move(stored.tracestate);
      sent.traceparent = m.trace.traceparent;
      sent.parent_span_id = stored.traceparent.substr(36, 16);
      sent.queue_ms = std::max<int64_t>(0, monotonic_ms() - q.enqueued_ms);
    }
    if (!sink_.submit(*q.handler, q.delivery.message, now_ms, &why)) {
      // A request the sink refuses (bad URL or header) is a failed attempt.
      HttpResult failed;
      failed.tag = static_cast<uint64_t>(q.delivery.message.id);
      failed.handler_key = key;
      failed.outcome = HttpOutcome::Fail;
      failed.error = why;
      refused.emplace_back(std::move(sent), std::move(failed));
      continue;
    }
    in_flight_.emplace(q.delivery.message.id, std::move(sent));
  }
  submits.reset();
  queue_.swap(keep);
  for (const auto& [key, waited] : refused_permit)
    for (const auto& q : queue_)
      if (q.handler->key == key) {
        limiter_->held_back(*q.handler, waited, now_ms);
        break;
      }
  for (auto& [sent, result] : refused) finish(sent, result, now_ms, false);
  // Last: the store may throw; the pipeline is consistent by now.
  if (!give_back.empty()) store.release(give_back);
}

void DeliveryPipeline::finish(const Sent& sent, const HttpResult& result, int64_t now_ms, bool reached_sink) {
  const int key = sent.handler->key;
  if (sent.permit) limiter_->release(*sent.handler);
  CircuitBreaker& b = breakers_[key];
  // A failure of a request sent before the breaker last opened says nothing
  // new about the endpoint: it neither reopens the breaker nor grows its
  // backoff, however late it comes back (only the probe's does).
  const bool stale_failure = result.outcome != HttpOutcome::Success && b.is_open() && sent.sent_ms < opened_at_ms_[key];
  if (!stale_failure) {
    const int64_t open_until = b.open_until_ms();
    b.record(result, sent.handler->options, now_ms);
    if (b.open_until_ms() != open_until) opened_at_ms_[key] = now_ms;
  }
  Completion c = classify_result(*sent.handler, result, sent.attempt, splitmix64(&rng_state_));
  c.receipt = sent.receipt;
  c.published = sent.published;
  c.breaker_open_until_ms = b.is_open() ? b.open_until_ms() : 0;
  if (reached_sink) c.send_ms = std::max<int64_t>(0, now_ms - sent.sent_ms);
  c.traceparent = sent.traceparent;
  c.parent_span_id = sent.parent_span_id;
  c.attempt = sent.attempt;
  c.queue_ms = sent.queue_ms;
  c.kafka_partition = result.kafka_partition;
  c.kafka_offset = result.kafka_offset;
  if (span_exporter_ != nullptr && !c.traceparent.empty()) span_exporter_->add_completion(c, *sent.handler, now_ms);
  if (waiting_.empty()) first_waiting_ms_ = now_ms;
  waiting_.push_back(std::move(c));
}

size_t DeliveryPipeline::collect(int64_t now_ms) {
  for (HttpResult& r : sink_.take_results()) {
    auto it = in_flight_.find(static_cast<int64_t>(r.tag));
    if (it == in_flight_.end()) continue;  // cancelled meanwhile
    Sent sent = std::move(it->second);
    in_flight_.erase(it);
    if (r.unsent) {
      if (sent.permit) limiter_->release(*sent.handler);
      held_.erase(static_cast<int64_t>(r.tag));
      ++unsent_;
      continue;
    }
    finish(sent, r, now_ms, true);
  }
  return waiting_.size();
}

size_t DeliveryPipeline::outstanding(int key) const {
  auto q = queued_of_.find(key);
  return sink_.in_flight(key) + (q == queued_of_.end() ? 0 : static_cast<size_t>(q->second));
}

const Receipt* DeliveryPipeline::receipt_in_flight(int64_t id) const {
  auto it = in_flight_.find(id);
  return it == in_flight_.end() ? nullptr : &it->second.receipt;
}

bool DeliveryPipeline::completion_due(int64_t now_ms) const {
  if (waiting_.empty() || now_ms < retry_flush_at_ms_) return false;
  return static_cast<int>(waiting_.size()) >= options_.complete_batch || in_flight_.empty() ||
         now_ms - first_waiting_ms_ >= options_.complete_delay_ms;
}

size_t DeliveryPipeline::flush(DeliveryStore& store, int64_t now_ms) {
  if (waiting_.empty()) return 0;
  std::vector<Completion> batch;
  batch.swap(waiting_);
  try {
    store.complete(batch);
  } catch (...) {
    // Kept, behind anything that came in meanwhile (none: one thread), and
    // tried again later; the receipts keep a late completion harmless.
    for (auto& c : waiting_) batch.push_back(std::move(c));
    waiting_.swap(batch);
    first_waiting_ms_ = now_ms;
    retry_flush_at_ms_ = now_ms + options_.complete_retry_ms;
    throw;
  }
  for (const auto& c : batch) held_.erase(c.id);
  retry_flush_at_ms_ = 0;
  return batch.size();
}

void DeliveryPipeline::release_queued(DeliveryStore& store) {
  if (queue_.empty()) return;
  std::vector<ClaimedDelivery> give_back;
  for (auto& q : queue_) {
    held_.erase(q.delivery.message.id);
    give_back.push_back(std::move(q.delivery));
  }
  queue_.clear();
  queued_of_.clear();
  store.release(give_back);
}

void DeliveryPipeline::cancel_in_flight() {
  sink_.cancel_all();
  for (const auto& kv : in_flight_) {
    held_.erase(kv.first);
    if (kv.second.permit) limiter_->release(*kv.second.handler);
  }
  in_flight_.clear();
}

void DeliveryPipeline::for_each_receipt(const std::function<void(const Receipt&)>& f) const {
  for (const auto& q : queue_) f(q.delivery.receipt);
  for (const auto& kv : in_flight_) f(kv.second.receipt);
  for (const auto& c : waiting_) f(c.receipt);
}

int64_t DeliveryPipeline::next_probe_ms(int64_t now_ms) const {
  int64_t next = -1;
  for (const auto& kv : breakers_) {
    const CircuitBreaker& b = kv.second;
    if (b.is_open() && b.open_until_ms() >= now_ms && (next < 0 || b.open_until_ms() < next)) next = b.open_until_ms();
  }
  return next;
}

bool DeliveryPipeline::breaker_open(int key) const {
  auto it = breakers_.find(key);
  return it != breakers_.end() && it->second.is_open();
}

}  // namespace relaybus::core
