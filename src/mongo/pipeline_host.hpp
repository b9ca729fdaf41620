// The core's delivery pipeline in the sidecar (core/delivery_pipeline.hpp:
// queue, concurrency, breaker, expiry, classification, batched completion)
// and what it sends through: the HTTP engine for http handlers, the kafka
// producers for kafka handlers, behind one core::RoutingSink. The dispatcher
// is the pipeline's store (dispatch_settle.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "core/routing_sink.hpp"
#include "core/span_exporter.hpp"
#include "mongo/config.hpp"
#include "mongo/split_limiter.hpp"

namespace relaybus::mongo {

class PipelineHost {
 public:
  // The engine, the sinks and the pipeline on first use; afterwards a
  // changed http_allowlist, which applies at once, to requests in flight too
  // (the engine checks every connection and every request against it).
  // false (logged): nothing can be sent, with the reason in the log.
  bool ensure(const Config& cfg, std::mt19937_64& rng);
  // Asked right before an http request leaves (core::HttpEngine::set_send_gate)
  // with the delivery's id and receipt: false keeps it from going out. Set
  // before the first ensure().
  void set_send_check(std::function<bool(int64_t id, const core::Receipt&)> check) { send_check_ = std::move(check); }
  bool ready() const { return pipeline_ != nullptr; }

  // Valid once ensure() returned true.
  core::DeliveryPipeline& pipeline() { return *pipeline_; }
  core::RoutingSink& router() { return *router_; }
  core::HttpEngine* engine() { return engine_.get(); }  // null before ensure()
  core::KafkaSink* kafka() { return kafka_sink_.get(); }
  // Handlers' max_concurrency and rate, this instance's share of them.
  SplitLimiter& limiter() { return limiter_; }

  // After a catalog reload: each handler's kind (the sink's counts are by
  // kind, before a fetch asks the pipeline for room), and the producers of
  // handlers that are gone or no longer kafka closed.
  void set_kind(int key, core::HandlerKind kind);
  void retain_kafka(const std::vector<int>& keys);
  // The span exporter of otlp_endpoint (null: none), made, replaced or
  // removed by ensure() as the settings change; its counters since the start.
  core::SpanExporter* spans() { return spans_.get(); }
  uint64_t spans_exported() const { return spans_base_[0] + (spans_ ? spans_->exported() : 0); }
  uint64_t spans_dropped() const { return spans_base_[1] + (spans_ ? spans_->dropped() : 0); }
  // Deliveries queued and in flight (0 before ensure()).
  size_t in_flight() const;
  size_t in_flight(int key) const;

 private:
  std::unique_ptr<core::HttpEngine> engine_;
  std::unique_ptr<core::HttpSink> sink_;
  std::unique_ptr<core::KafkaSink> kafka_sink_;
  std::unique_ptr<core::RoutingSink> router_;
  std::unique_ptr<core::DeliveryPipeline> pipeline_;
  SplitLimiter limiter_;
  std::string allowlist_;
  std::unique_ptr<core::SpanExporter> spans_;
  std::string spans_endpoint_, spans_headers_;
  uint64_t spans_base_[2] = {0, 0};  // exported, dropped by exporters replaced since
  void configure_spans(const Config& cfg);
  std::function<bool(int64_t, const core::Receipt&)> send_check_;
};

}  // namespace relaybus::mongo
