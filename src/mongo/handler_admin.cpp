#include "mongo/handler_admin.hpp"

#include "core/handler_config.hpp"
#include "core/text_util.hpp"

namespace relaybus::mongo {

using nlohmann::json;

namespace {

std::optional<HandlerDoc> find_handler(Store& store, const std::string& name) {
  for (auto& h : store.load_handlers(nullptr))
    if (h.name == name) return h;
  return std::nullopt;
}

// The kinds this sidecar serves; notify is PostgreSQL's LISTEN/NOTIFY.
void check_kind(core::HandlerKind kind) {
  if (kind == core::HandlerKind::Http || kind == core::HandlerKind::Pull || kind == core::HandlerKind::Kafka) return;
  throw BadInput(std::string("handler kind \"") + core::handler_kind_name(kind) +
                 "\" is not served by relaybus-mongo (http, pull and kafka; notify is PostgreSQL's LISTEN/NOTIFY)");
}

// Options and target checked as at creation; fills h.options.
void validate(HandlerDoc& h) {
  std::string why;
  if (!core::validate_target(h.kind, h.target, h.target.empty() && h.kind == core::HandlerKind::Pull, &why))
    throw BadInput("invalid target: " + why);
  if (!core::parse_handler_options(h.kind, h.options_json, &h.options, &why)) throw BadInput("invalid options: " + why);
  if (!core::check_secret_strength(h.options, &why)) throw BadInput("invalid options: " + why);
}

json describe(const HandlerDoc& h) {
  return {{"handler", h.name},
          {"kind", core::handler_kind_name(h.kind)},
          {"target", h.target},
          {"options", json::parse(core::options_public_json(h.kind, h.options))}};
}

}  // namespace

bool merge_options(const std::string& stored, const std::string& changes, std::string* merged, std::string* why) {
  json base, delta;
  try {
    base = json::parse(stored.empty() ? "{}" : stored);
    delta = json::parse(changes);
  } catch (const json::parse_error& e) {
    *why = std::string("not valid JSON: ") + e.what();
    return false;
  }
  if (!base.is_object()) base = json::object();  // a stored non-object is rewritten whole
  if (!delta.is_object()) {
    *why = "options must be a JSON object";
    return false;
  }
  for (auto& [k, v] : delta.items()) {
    if (v.is_null())
      base.erase(k);
    else
      base[k] = v;
  }
  *merged = base.dump();
  return true;
}

json handler_create(Store& store, const std::string& name, const std::string& kind, const std::string& target,
                    const std::string& options_json) {
  HandlerDoc h;
  h.name = name;
  std::string why;
  if (!core::is_valid_handler_name(h.name, &why)) throw BadInput("invalid handler name: " + why);
  if (!core::parse_handler_kind(kind, &h.kind, &why)) throw BadInput("invalid handler kind: " + why);
  check_kind(h.kind);
  h.target = target;
  h.options_json = options_json;
  validate(h);
  if (!store.insert_handler(h))
    throw BadInput("handler " + core::text::quote(name) +
                   " already exists (handler alter changes it; handler drop removes it)");
  return describe(h);
}

json handler_alter(Store& store, const std::string& name, const std::optional<std::string>& target,
                   const std::optional<std::string>& options_json) {
  if (!target && !options_json) throw BadInput("handler alter needs --target and/or --options");
  auto found = find_handler(store, name);
  if (!found) throw BadInput("handler " + core::text::quote(name) + " does not exist");
  HandlerDoc h = *found;
  if (target) h.target = *target;
  if (options_json) {
    std::string merged, why;
    if (!merge_options(h.options_json, *options_json, &merged, &why)) throw BadInput("invalid options: " + why);
    h.options_json = merged;
  }
  validate(h);
  store.put_handler(h);  // a running dispatcher applies it at its next catalog read (lease / 3)
  return describe(h);
}

json handler_drop(Store& store, const std::string& name, bool force, int64_t now_ms) {
  if (!find_handler(store, name)) {
    // A document that no longer parses can still be dropped.
    bool any = false;
    std::vector<std::string> bad;
    store.load_handlers(&bad);
    for (const auto& b : bad) any |= b.rfind(name + ":", 0) == 0;
    if (!any) throw BadInput("handler " + core::text::quote(name) + " does not exist");
  }
  const int64_t pending = store.count_pending(name);
  if (pending > 0 && !force)
    throw BadInput("handler " + core::text::quote(name) + " has " + std::to_string(pending) +
                   " pending deliveries; drop refused (--force dead-letters them)");
  // Routes and the handler first, so that new publishes no longer route to
  // it; then every delivery left (counted above, or published meanwhile) goes
  // to the dead letters.
  store.drop_handler(name);
  const int64_t moved = store.dead_letter_handler(name, "handler dropped", now_ms);
  return {{"dropped", name}, {"dead_lettered", moved}};
}

}  // namespace relaybus::mongo
