#include "routing_sink.hpp"

namespace relaybus::core {

DeliverySink& RoutingSink::sink(int key) const {
  auto it = kind_.find(key);
  return it != kind_.end() && it->second == HandlerKind::Kafka ? kafka_ : http_;
}

bool RoutingSink::submit(const PipelineHandler& handler, const WebhookMessage& message, int64_t now_ms,
                         std::string* why) {
  kind_[handler.key] = handler.kind;
  return sink(handler.key).submit(handler, message, now_ms, why);
}

std::vector<HttpResult> RoutingSink::take_results() {
  std::vector<HttpResult> out = http_.take_results();
  for (auto& r : kafka_.take_results()) out.push_back(std::move(r));
  return out;
}

void RoutingSink::cancel_all() {
  http_.cancel_all();
  kafka_.cancel_all();
}

void RoutingSink::begin_submits() {
  http_.begin_submits();
  kafka_.begin_submits();
}

void RoutingSink::end_submits() {
  kafka_.end_submits();
  http_.end_submits();
}

}  // namespace relaybus::core
