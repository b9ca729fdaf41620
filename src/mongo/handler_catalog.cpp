#include "mongo/handler_catalog.hpp"

#include "mongo/util.hpp"

namespace relaybus::mongo {

void HandlerCatalog::load(std::vector<HandlerDoc> docs, const std::vector<std::string>& bad) {
  for (const auto& b : bad)
    if (warned_.insert("handler " + b).second) log_warn("handler skipped", {{"error", b}});
  std::set<std::string> seen, seen_pull;
  for (auto& d : docs) {
    seen.insert(d.name);
    if (d.kind == core::HandlerKind::Pull) {
      seen_pull.insert(d.name);
      sent_.erase(d.name);  // dropped as http and created again as pull
      pulled_[d.name] = d;
      continue;
    }
    if (d.kind != core::HandlerKind::Http && d.kind != core::HandlerKind::Kafka) {
      if (warned_.insert("kind " + d.name).second)
        log_warn("handler kind not served by relaybus-mongo (http, pull and kafka)",
                 {{"handler", d.name}, {"kind", core::handler_kind_name(d.kind)}});
      continue;
    }
    const int key = keys_.try_emplace(d.name, static_cast<int>(keys_.size()) + 1).first->second;
    SentHandler& hs = sent_[d.name];
    hs.key = key;
    hs.doc = std::move(d);
    auto pipe = std::make_shared<core::PipelineHandler>();
    pipe->key = hs.key;
    pipe->kind = hs.doc.kind;
    pipe->name = hs.doc.name;
    pipe->target = hs.doc.target;
    pipe->options = hs.doc.options;
    pipe->options.concurrency = core::handler_in_flight_limit(hs.doc.kind, hs.doc.options);
    hs.pipe = std::move(pipe);
  }
  for (auto it = sent_.begin(); it != sent_.end();) it = seen.count(it->first) ? std::next(it) : sent_.erase(it);
  for (auto it = pulled_.begin(); it != pulled_.end();)
    it = seen_pull.count(it->first) ? std::next(it) : pulled_.erase(it);
}

const HandlerDoc* HandlerCatalog::pull_handler(const std::string& name) const {
  auto it = pulled_.find(name);
  return it == pulled_.end() ? nullptr : &it->second;
}

std::vector<int> HandlerCatalog::kafka_keys() const {
  std::vector<int> keys;
  for (const auto& [name, h] : sent_)
    if (h.doc.kind == core::HandlerKind::Kafka) keys.push_back(h.key);
  return keys;
}

}  // namespace relaybus::mongo
