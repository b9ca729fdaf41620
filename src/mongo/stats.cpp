#include "mongo/stats.hpp"

#include <algorithm>

#include "core/handler_config.hpp"
#include "core/store_policy.hpp"
#include "mongo/dispatcher.hpp"
#include "mongo/metrics.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

using nlohmann::json;

json stats_json(Store& store, int64_t now) {
  json out = json::array();
  const auto load = store.live_load(now);
  json le = json::array();
  for (double b : core::LatencyHistogram::kBoundsS) le.push_back(b);
  for (const auto& h : store.load_handlers(nullptr)) {
    const Store::Backlog b = store.backlog(h.name, now);
    Store::HandlerLoad l;
    if (auto it = load.find(h.name); it != load.end()) l = it->second;
    l.latency_buckets.resize(core::LatencyHistogram::kBoundsS.size(), 0);
    out.push_back(
        {{"handler", h.name},
         {"kind", core::handler_kind_name(h.kind)},
         {"pending", b.pending},
         {"ready", b.ready},
         {"delayed", b.delayed},
         {"in_flight", l.in_flight},
         {"retrying", b.retrying},
         {"dead", b.dead},
         {"oldest_age_ms", b.oldest_ms > 0 ? std::max<int64_t>(0, now - b.oldest_ms) : 0},
         {"held_back", l.held_back},
         {"limited", l.limited},
         {"latency",
          {{"le", le}, {"buckets", l.latency_buckets}, {"count", l.latency_count}, {"sum_seconds", l.latency_sum_s}}}});
  }
  return out;
}

std::map<std::string, Store::HandlerLoad> Dispatcher::handler_load() {
  std::map<std::string, Store::HandlerLoad> out;
  metrics_.handler_in_flight.clear();
  const int64_t now = wall_ms();
  for (const auto& [name, h] : catalog_.sent()) {
    Store::HandlerLoad& l = out[name];
    l.in_flight = static_cast<int64_t>(host_.in_flight(h.key));
    l.held_back = static_cast<int64_t>(host_.limiter().held_back_total(h.key));
    l.limited = host_.limiter().limited(h.key, now);
  }
  if (pull_)
    for (const auto& [name, n] : pull_->leased_by_handler()) out[name].in_flight = n;
  for (const auto& [name, m] : metrics_.handlers) {
    auto& l = out[name];
    l.latency_buckets.assign(m.latency.buckets.begin(), m.latency.buckets.end());
    l.latency_count = static_cast<int64_t>(m.latency.count);
    l.latency_sum_s = m.latency.sum_s;
  }
  for (const auto& [name, l] : out) metrics_.handler_in_flight[name] = l.in_flight;
  return out;
}

void Dispatcher::refresh_backlog(int64_t now) {
  const int64_t t0 = monotonic_ms();
  loop_.next_backlog_ms = core::next_backlog_refresh_ms(now, cfg_.lease_ms, 0);
  std::map<std::string, Metrics::Backlog> fresh;
  std::vector<std::string> names;
  for (const auto& [name, h] : catalog_.sent()) names.push_back(name);
  for (const auto& [name, h] : catalog_.pulled()) names.push_back(name);
  for (const auto& name : names) {
    const Store::Backlog b = store_.backlog(name, now);
    fresh[name] = {b.pending,  b.ready, b.delayed,
                   b.retrying, b.dead,  b.oldest_ms > 0 ? std::max<int64_t>(0, now - b.oldest_ms) / 1000.0 : 0.0};
  }
  metrics_.backlog = std::move(fresh);
  loop_.next_backlog_ms = core::next_backlog_refresh_ms(now, cfg_.lease_ms, monotonic_ms() - t0);
}

}  // namespace relaybus::mongo
