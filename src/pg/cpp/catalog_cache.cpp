#include "pg/cpp/catalog_cache.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/cloudevents.hpp"
#include "core/route_resolver.hpp"
#include "pg/cpp/handler_config.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

constexpr size_t kMaxMemoTopics = 4096;

struct Catalog {
  std::vector<HandlerEntry> handlers;
  std::vector<HandlerConfig> configs;                    // handlers[i].config is &configs[i]
  std::unordered_map<std::string_view, size_t> by_name;  // views of handlers[i].name
  std::unordered_map<int32_t, size_t> by_id;
  core::RouteResolver routes;                                          // keyed by handler id
  std::unordered_map<std::string, std::vector<RouteTarget>> by_topic;  // memo
  std::vector<core::RouteResolver::Decision> scratch;                  // a memo miss's decisions, reused
};

static void copy_name(char (&to)[kNameLen], const char* from) {
  std::strncpy(to, from, kNameLen - 1);
  to[kNameLen - 1] = '\0';
}

bool catalog_build(const CatalogHandlerRow* hs, int nh, const CatalogRouteRow* rs, int nr,
                   const char* message_id_prefix, const char* database_name, Catalog** out, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    auto cat = std::make_unique<Catalog>();
    // Reserved: entries point into configs, by_name into entries.
    cat->handlers.reserve(nh);
    cat->configs.reserve(nh);
    for (int i = 0; i < nh; i++) {
      HandlerEntry h{};
      HandlerConfig& config = cat->configs.emplace_back();
      h.id = hs[i].id;
      h.paused = hs[i].paused;
      copy_name(h.name, hs[i].name);
      if (hs[i].target != nullptr) {
        copy_name(h.channel, hs[i].target);
        config.target = hs[i].target;
      }
      std::string why;
      if (!core::parse_handler_kind(hs[i].kind, &h.kind, &why)) throw SqlError(sqlstates::kInternalError, why);
      // Stored options were validated on the way in; a failure here means
      // the row was written by hand, and defaults are the safe reading.
      std::string ignored;
      if (!core::parse_handler_options(h.kind, hs[i].options, &config.options, &ignored))
        config.options = core::HandlerOptions{};
      config.options.message_id_prefix = message_id_prefix;
      config.options.default_cloudevents_source = core::default_cloudevents_source("/relaybus/", database_name);
      h.ack = config.options.ack;
      h.inline_payload = config.options.inline_payload;
      h.lease_ms = config.options.lease_ms;
      h.timeout_ms = config.options.timeout_ms;
      h.key_window = core::effective_key_window(h.kind, config.options);
      h.config = &config;
      cat->handlers.push_back(h);
      cat->by_name.emplace(std::string_view(cat->handlers.back().name), cat->handlers.size() - 1);
      cat->by_id.emplace(h.id, cat->handlers.size() - 1);
    }
    std::vector<core::RouteInput> routes;
    routes.reserve(nr);
    for (int i = 0; i < nr; i++) {
      core::RouteInput r;
      r.handler = rs[i].handler_id;
      r.pattern = rs[i].pattern;
      if (rs[i].wire != nullptr) r.wire_name = rs[i].wire;
      routes.push_back(std::move(r));
    }
    cat->routes = core::RouteResolver(std::move(routes));
    *out = cat.release();
  });
}

void catalog_free(Catalog* cat) noexcept { delete cat; }

const HandlerEntry* catalog_find_name(const Catalog* cat, const char* name) noexcept {
  auto it = cat->by_name.find(std::string_view(name));
  return it == cat->by_name.end() ? nullptr : &cat->handlers[it->second];
}

const HandlerEntry* catalog_find_id(const Catalog* cat, int32_t id) noexcept {
  auto it = cat->by_id.find(id);
  return it == cat->by_id.end() ? nullptr : &cat->handlers[it->second];
}

int catalog_size(const Catalog* cat) noexcept { return static_cast<int>(cat->handlers.size()); }

const HandlerEntry* catalog_entry(const Catalog* cat, int i) noexcept { return &cat->handlers[i]; }

bool catalog_route(Catalog* cat, const char* topic, const RouteTarget** targets, int* ntargets,
                   ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    auto it = cat->by_topic.find(topic);
    if (it == cat->by_topic.end()) {
      // In handler id order, as deliveries are inserted (core::RouteResolver
      // decides per handler).
      cat->scratch.clear();
      cat->routes.resolve(topic, &cat->scratch);
      std::vector<RouteTarget> found;
      found.reserve(cat->scratch.size());
      for (const auto& d : cat->scratch) {
        const auto hid = static_cast<int32_t>(d.handler);
        auto h = cat->by_id.find(hid);
        bool by_workers = h != cat->by_id.end() && cat->handlers[h->second].kind != core::HandlerKind::Pull;
        const auto& wire = d.route->wire_name;
        found.push_back(RouteTarget{hid, wire ? wire->c_str() : nullptr, by_workers});
      }
      if (cat->by_topic.size() >= kMaxMemoTopics) cat->by_topic.clear();
      it = cat->by_topic.emplace(topic, std::move(found)).first;
    }
    *targets = it->second.empty() ? nullptr : it->second.data();
    *ntargets = static_cast<int>(it->second.size());
  });
}

}  // namespace relaybus::pg
