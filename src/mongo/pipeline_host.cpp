#include "mongo/pipeline_host.hpp"

#include "core/outbound_policy.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

void PipelineHost::configure_spans(const Config& cfg) {
  if (spans_endpoint_ == cfg.otlp_endpoint && spans_headers_ == cfg.otlp_headers) return;
  if (spans_) {
    spans_base_[0] += spans_->exported();
    spans_base_[1] += spans_->dropped() + spans_->queued();
  }
  if (pipeline_) pipeline_->set_span_exporter(nullptr);
  spans_.reset();
  spans_endpoint_ = cfg.otlp_endpoint;
  spans_headers_ = cfg.otlp_headers;
  if (cfg.otlp_endpoint.empty()) return;
  core::SpanExporterOptions o;
  std::string why;
  (void)core::parse_otlp_headers(cfg.otlp_headers, &o.headers, &why);  // checked by load_config
  o.endpoint = cfg.otlp_endpoint;
  o.edition = "mongo";
  spans_ = std::make_unique<core::SpanExporter>(std::move(o));
  if (pipeline_) pipeline_->set_span_exporter(spans_.get());
}

bool PipelineHost::ensure(const Config& cfg, std::mt19937_64& rng) {
  configure_spans(cfg);
  if (engine_ && allowlist_ == cfg.http_allowlist) return true;
  core::HttpEngineOptions opts;
  std::string why;
  if (!core::parse_allowlist(cfg.http_allowlist, &opts.allow, &why)) {
    log_error("http_allowlist is invalid; http callouts are off", {{"error", why}});
    return false;
  }
  if (engine_) {
    engine_->set_allowlist(opts.allow);
    allowlist_ = cfg.http_allowlist;
    return true;
  }
  opts.max_total = cfg.max_in_flight;
  engine_ = std::make_unique<core::HttpEngine>(opts);
  allowlist_ = cfg.http_allowlist;
  if (!engine_->ok()) {
    log_error("libcurl could not be initialized");
    engine_.reset();
    return false;
  }
  if (send_check_)
    engine_->set_send_gate([this](uint64_t tag) {
      const int64_t id = static_cast<int64_t>(tag);
      const core::Receipt* r = pipeline_ ? pipeline_->receipt_in_flight(id) : nullptr;
      return r != nullptr && send_check_(id, *r);  // none: cancelled meanwhile
    });
  sink_ = std::make_unique<core::HttpSink>(*engine_);
  kafka_sink_ = std::make_unique<core::KafkaSink>();
  // The loop polls the sink by its deadlines too (WaitSet::wait).
  kafka_sink_->set_pipelined(true);
  if (!kafka_sink_->ok()) {
    log_error("the kafka producers' wake-up pipe could not be made");
    kafka_sink_.reset();
    sink_.reset();
    engine_.reset();
    return false;
  }
  router_ = std::make_unique<core::RoutingSink>(*sink_, *kafka_sink_);
  core::PipelineOptions po;
  po.max_in_flight = cfg.max_in_flight;
  pipeline_ = std::make_unique<core::DeliveryPipeline>(*router_, po, rng());
  pipeline_->set_span_exporter(spans_.get());
  pipeline_->set_limiter(&limiter_);
  return true;
}

void PipelineHost::set_kind(int key, core::HandlerKind kind) {
  if (router_) router_->set_kind(key, kind);
}

void PipelineHost::retain_kafka(const std::vector<int>& keys) {
  if (kafka_sink_) kafka_sink_->retain_handlers(keys);
}

size_t PipelineHost::in_flight() const { return router_ ? router_->in_flight() : 0; }

size_t PipelineHost::in_flight(int key) const { return router_ ? router_->in_flight(key) : 0; }

}  // namespace relaybus::mongo
