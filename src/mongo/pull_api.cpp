#include "mongo/pull_api.hpp"

#include <algorithm>
#include <cinttypes>

#include <nlohmann/json.hpp>

#include "core/duration.hpp"
#include "core/trace_context.hpp"
#include "core/webhook_delivery.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

using nlohmann::json;

namespace {

ApiResponse reply(int status, json body) { return {status, body.dump()}; }
ApiResponse error(int status, const std::string& message) { return reply(status, {{"error", message}}); }

struct Refused {
  int status;
  std::string message;
};

// A duration field: "30s" text or a number of milliseconds; absent: def.
int64_t duration_field(const json& j, const char* name, int64_t def, int64_t lo, int64_t hi) {
  if (!j.contains(name) || j[name].is_null()) return def;
  const json& v = j[name];
  int64_t ms;
  if (v.is_number_integer()) {
    ms = v.get<int64_t>();
  } else if (v.is_string()) {
    std::string why;
    auto p = core::parse_duration_ms(v.get<std::string>(), &why);
    if (!p) throw Refused{400, std::string("\"") + name + "\": " + why};
    ms = *p;
  } else {
    throw Refused{400, std::string("\"") + name + "\" must be a duration (\"30s\") or milliseconds"};
  }
  if (ms < lo || ms > hi)
    throw Refused{400, std::string("\"") + name + "\" must be between " + core::format_duration_ms(lo) + " and " +
                           core::format_duration_ms(hi)};
  return ms;
}

int64_t id_field(const json& v, const char* what) {
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    throw Refused{400, std::string(what) + " must be a positive integer"};
  return v.get<int64_t>();
}

std::string lease_field(const json& v, const char* what) {
  if (!v.is_string()) throw Refused{400, std::string(what) + " must be a lease string from a claim"};
  return v.get<std::string>();
}

}  // namespace

PullApi::PullApi(Store& store, Metrics& metrics, const PullHost& host, uint64_t seed)
    : store_(store), metrics_(metrics), host_(host), rng_(seed), claimer_(store, metrics) {}

std::string PullApi::new_token() {
  std::random_device rd;  // the kernel's generator: a receipt must not be guessable
  char buf[33];
  snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

ApiResponse PullApi::handle(const std::string& method, const std::string& path, const std::string& authorization,
                            const std::string& body, const std::string& token, int64_t scan_window,
                            int64_t priority_aging_ms) {
  if (token.empty()) return error(403, "the pull API is off: set api_token (docs/mongo.md, \"Pull handlers\")");
  if (authorization != "Bearer " + token) return error(401, "missing or wrong bearer token");
  // /v1/handlers/<name>/<op>
  const std::string prefix = "/v1/handlers/";
  if (path.rfind(prefix, 0) != 0) return error(404, "not found");
  const std::string rest = path.substr(prefix.size());
  const auto slash = rest.find('/');
  if (slash == std::string::npos) return error(404, "not found");
  const std::string name = rest.substr(0, slash), op = rest.substr(slash + 1);
  if (op != "claim" && op != "ack" && op != "nack" && op != "extend") return error(404, "not found");
  if (method != "POST") return error(405, "use POST");
  const HandlerDoc* h = host_.pull_handler(name);
  if (h == nullptr) return error(404, "handler \"" + name + "\" does not exist or is not a pull handler");
  try {
    if (op == "claim") return claim(*h, body, scan_window, priority_aging_ms);
    if (op == "ack") return ack(*h, body);
    if (op == "nack") return nack(*h, body);
    return extend(*h, body);
  } catch (const Refused& r) {
    return error(r.status, r.message);
  } catch (const json::exception& e) {
    return error(400, std::string("invalid JSON body: ") + e.what());
  } catch (const StoreError& e) {
    metrics_.store_errors++;
    return error(503, std::string("store error: ") + e.what());
  }
}

const PullApi::Lease* PullApi::check(const HandlerDoc& h, int64_t id, const std::string& token, int64_t now,
                                     std::string* why) const {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.handler != h.name) {
    *why = "no lease";
  } else if (it->second.token != token) {
    *why = "another holder";
  } else if (now >= it->second.until_ms) {
    *why = "it expired";
  } else if (!host_.lane_holds(it->second.lane, it->second.since_epoch, now)) {
    *why = "this instance no longer holds its lane";
  } else {
    return &it->second;
  }
  *why = "lease of delivery " + std::to_string(id) + " is not held: " + *why;
  return nullptr;
}

ApiResponse PullApi::claim(const HandlerDoc& h, const std::string& body, int64_t window, int64_t aging_ms) {
  const json in = body.empty() ? json::object() : json::parse(body);
  if (!in.is_object()) throw Refused{400, "the body must be a JSON object"};
  int max = 10, per_key = 1;
  if (in.contains("max")) {
    if (!in["max"].is_number_integer() || in["max"].get<int64_t>() < 1 || in["max"].get<int64_t>() > 1000)
      throw Refused{400, "\"max\" must be an integer 1..1000"};
    max = in["max"].get<int>();
  }
  if (in.contains("per_key")) {
    if (!in["per_key"].is_number_integer() || in["per_key"].get<int64_t>() < 1 || in["per_key"].get<int64_t>() > 1000)
      throw Refused{400, "\"per_key\" must be an integer 1..1000"};
    per_key = in["per_key"].get<int>();
  }
  const int64_t lease_ms = duration_field(in, "lease", h.options.lease_ms, 1000, core::kMsPerDay);
  const int64_t now = wall_ms();
  expire(now);
  ClaimAsk ask;
  std::map<int, int64_t> since;
  for (const auto& [lane, epoch] : host_.claimable_lanes(now)) {
    ask.lanes.push_back(lane);
    since[lane] = epoch;
  }
  ask.window = static_cast<int>(window);
  ask.limits.max = max;
  ask.limits.per_key = per_key;
  ask.aging_ms = aging_ms;
  ask.now_ms = now;
  ask.handed_out = [this](int64_t id) { return leases_.count(id) > 0; };
  claimer_.new_pass();  // a request's claim sees every delivery inserted before it
  json out = {{"deliveries", json::array()}};
  for (const Delivery& d : claimer_.claim(h.name, ask).deliveries) {
    Lease l{new_token(), h.name, d.lane, since[d.lane], now + lease_ms, d.attempt, d.has_key, d.key, d.published_ms};
    json row = {{"id", d.id},
                {"event_id", d.event_id},
                {"topic", d.topic},
                {"key", d.has_key ? json(d.key) : json(nullptr)},
                {"seq", d.has_key ? json(d.seq) : json(nullptr)},
                {"attempt", d.attempt + 1},
                {"published_at", iso8601_ms(d.published_ms)},
                {"payload", json::parse(d.payload_json)},
                {"headers", d.headers_json.empty() ? json(nullptr) : json::parse(d.headers_json)},
                {"lease", l.token},
                {"lease_until", iso8601_ms(l.until_ms)}};
    // This handover as a span of the event's trace, as relay_claim's column.
    const core::TraceContext trace = core::trace_context_from_headers(d.headers_json);
    if (trace.present()) row["traceparent"] = core::attempt_traceparent(trace.traceparent, rng_());
    out["deliveries"].push_back(std::move(row));
    leases_[d.id] = std::move(l);
  }
  return reply(200, out);
}

ApiResponse PullApi::ack(const HandlerDoc& h, const std::string& body) {
  const json in = json::parse(body);
  if (!in.is_object() || !in.contains("ids") || !in["ids"].is_array() || !in.contains("leases") ||
      !in["leases"].is_array())
    throw Refused{400, "the body must be {\"ids\": [...], \"leases\": [...]}"};
  if (in["ids"].size() != in["leases"].size()) throw Refused{400, "\"ids\" and \"leases\" must have the same length"};
  if (in["ids"].empty() || in["ids"].size() > 1000) throw Refused{400, "\"ids\" must have 1..1000 elements"};
  const int64_t now = wall_ms();
  std::vector<int64_t> ids;
  // All or nothing: every lease is checked before anything is written.
  for (size_t i = 0; i < in["ids"].size(); i++) {
    const int64_t id = id_field(in["ids"][i], "\"ids\" elements");
    std::string why;
    if (check(h, id, lease_field(in["leases"][i], "\"leases\" elements"), now, &why) == nullptr)
      return reply(409, {{"error", why}, {"id", id}});
    ids.push_back(id);
  }
  const int64_t deleted = store_.complete(ids);
  auto& m = metrics_.handlers[h.name];
  for (int64_t id : ids) {
    const Lease& l = leases_[id];
    m.delivered++;
    if (l.published_ms > 0) metrics_.observe_latency(h.name, (now - l.published_ms) / 1000.0);
    leases_.erase(id);
  }
  return reply(200, {{"acked", static_cast<int64_t>(ids.size())}, {"deleted", deleted}});
}

ApiResponse PullApi::nack(const HandlerDoc& h, const std::string& body) {
  const json in = json::parse(body);
  if (!in.is_object() || !in.contains("id") || !in.contains("lease"))
    throw Refused{400, "the body must be {\"id\": N, \"lease\": \"...\", \"delay\"?: \"5s\", \"error\"?: \"...\"}"};
  const int64_t id = id_field(in["id"], "\"id\"");
  const std::string token = lease_field(in["lease"], "\"lease\"");
  const int64_t delay = duration_field(in, "delay", -1, 0, 7 * core::kMsPerDay);
  std::string message = "nacked";
  if (in.contains("error") && !in["error"].is_null()) {
    if (!in["error"].is_string()) throw Refused{400, "\"error\" must be a string"};
    message = in["error"].get<std::string>();
  }
  const int64_t now = wall_ms();
  std::string why;
  const Lease* l = check(h, id, token, now, &why);
  if (l == nullptr) return reply(409, {{"error", why}, {"id", id}});
  const core::FailureDecision dec = core::decide_failure(h.options, false, l->attempt + 1, delay, rng_());
  store_.fail({{id, message, 0, dec.dead, now + dec.retry_in_ms, h.name}}, now);
  auto& m = metrics_.handlers[h.name];
  (dec.dead ? m.dead : m.retried)++;
  leases_.erase(id);
  return reply(200, {{"id", id}, {"dead", dec.dead}, {"retry_in_ms", dec.dead ? 0 : dec.retry_in_ms}});
}

ApiResponse PullApi::extend(const HandlerDoc& h, const std::string& body) {
  const json in = json::parse(body);
  if (!in.is_object() || !in.contains("id") || !in.contains("lease"))
    throw Refused{400, "the body must be {\"id\": N, \"lease\": \"...\", \"by\"?: \"30s\"}"};
  const int64_t id = id_field(in["id"], "\"id\"");
  const std::string token = lease_field(in["lease"], "\"lease\"");
  const int64_t by = duration_field(in, "by", h.options.lease_ms, 1000, core::kMsPerDay);
  const int64_t now = wall_ms();
  std::string why;
  if (check(h, id, token, now, &why) == nullptr) return reply(409, {{"error", why}, {"id", id}});
  leases_[id].until_ms = now + by;
  return reply(200, {{"id", id}, {"lease_until", iso8601_ms(now + by)}});
}

void PullApi::expire(int64_t now) {
  std::vector<Failure> failures;
  for (auto it = leases_.begin(); it != leases_.end();) {
    const Lease& l = it->second;
    if (now < l.until_ms && host_.lane_holds(l.lane, l.since_epoch, now)) {
      ++it;
      continue;
    }
    const HandlerDoc* h = host_.pull_handler(l.handler);
    // Charged only while the lane is still ours; a lost lane's next holder hands it out again.
    if (h != nullptr && now >= l.until_ms && host_.lane_holds(l.lane, l.since_epoch, now)) {
      const core::FailureDecision dec = core::decide_failure(h->options, false, l.attempt + 1, -1, rng_());
      failures.push_back({it->first, "lease expired", 0, dec.dead, now + dec.retry_in_ms, l.handler});
      auto& m = metrics_.handlers[l.handler];
      (dec.dead ? m.dead : m.retried)++;
    }
    it = leases_.erase(it);
  }
  if (!failures.empty()) store_.fail(failures, now);
}

void PullApi::for_each_lane(const std::function<void(int)>& f) const {
  for (const auto& [id, l] : leases_) f(l.lane);
}

std::map<std::string, int64_t> PullApi::leased_by_handler() const {
  std::map<std::string, int64_t> out;
  for (const auto& [id, l] : leases_) out[l.handler]++;
  return out;
}

}  // namespace relaybus::mongo
