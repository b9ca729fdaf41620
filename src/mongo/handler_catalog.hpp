// The handlers a dispatcher serves, as of its last lease tick: http and kafka
// handlers are sent through the pipeline, each under a small integer key that
// stays with its name for the life of the process (the pipeline's and the
// sinks' per-handler state is by key); pull handlers are served by the pull
// API. Kinds the sidecar does not serve are skipped with one warning.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

struct SentHandler {
  HandlerDoc doc;
  int key = 0;
  std::shared_ptr<const core::PipelineHandler> pipe;  // the doc, as the pipeline sends it
};

class HandlerCatalog {
 public:
  // Replaces the catalog with the store's documents (load_handlers: `docs`,
  // and `bad`, the unusable ones, each warned about once). Deliveries already
  // claimed keep the handler as it was (their PipelineHandler).
  void load(std::vector<HandlerDoc> docs, const std::vector<std::string>& bad);

  std::map<std::string, SentHandler>& sent() { return sent_; }
  const std::map<std::string, SentHandler>& sent() const { return sent_; }
  const std::map<std::string, HandlerDoc>& pulled() const { return pulled_; }
  const HandlerDoc* pull_handler(const std::string& name) const;
  std::vector<int> kafka_keys() const;

 private:
  std::map<std::string, SentHandler> sent_;
  std::map<std::string, int> keys_;
  std::map<std::string, HandlerDoc> pulled_;
  std::set<std::string> warned_;
};

}  // namespace relaybus::mongo
