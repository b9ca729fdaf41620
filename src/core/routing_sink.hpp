#pragma once

// One pipeline, several sinks: http handlers' deliveries go to the HTTP
// engine, kafka handlers' to the Kafka producers. The pipeline's queue,
// claim-ahead, breakers, classification and batched completion stay one for
// all kinds; only the sending differs. A handler is routed by the kind it was
// last given with (set_kind, or a submit's PipelineHandler::kind); unknown
// handlers are http's.

#include <unordered_map>

#include "delivery_pipeline.hpp"

namespace relaybus::core {

class RoutingSink final : public DeliverySink {
 public:
  RoutingSink(DeliverySink& http, DeliverySink& kafka) : http_(http), kafka_(kafka) {}
  void set_kind(int key, HandlerKind kind) { kind_[key] = kind; }

  void set_handler_limit(int key, int concurrency) override { sink(key).set_handler_limit(key, concurrency); }
  bool can_submit(int key) const override { return sink(key).can_submit(key); }
  size_t in_flight() const override { return http_.in_flight() + kafka_.in_flight(); }
  size_t in_flight(int key) const override { return sink(key).in_flight(key); }
  bool submit(const PipelineHandler& handler, const WebhookMessage& message, int64_t now_ms, std::string* why) override;
  std::vector<HttpResult> take_results() override;
  void cancel_all() override;
  void begin_submits() override;
  void end_submits() override;

 private:
  DeliverySink& sink(int key) const;
  DeliverySink& http_;
  DeliverySink& kafka_;
  std::unordered_map<int, HandlerKind> kind_;
};

}  // namespace relaybus::core
