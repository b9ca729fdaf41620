// relaybus-mongo: the relaybus sidecar for MongoDB. See docs/mongo.md.
//
//   relaybus-mongo init                               collections and indexes (idempotent)
//   relaybus-mongo handler create NAME http URL [--options JSON]
//   relaybus-mongo handler create NAME kafka kafka://HOST:PORT[,HOST:PORT...]/TOPIC [--options JSON]
//   relaybus-mongo handler alter NAME [--target URL] [--options JSON]
//   relaybus-mongo handler drop NAME [--force] | handler list
//   relaybus-mongo route PATTERN HANDLER [--wire NAME] | unroute PATTERN HANDLER
//   relaybus-mongo publish TOPIC PAYLOAD [--key K] [--priority 0..3] [--not-before T] [--headers JSON] [--dedupe-key K]
//   relaybus-mongo sequence                           sequence the outbox once (role free)
//   relaybus-mongo run                                the dispatcher
//   relaybus-mongo replay [--handler NAME] [--id N]...
//   relaybus-mongo stats
//   relaybus-mongo lane [KEY...]                      lanes of keys (args, or stdin lines)
//
// Exit codes: 0 success, 1 runtime failure (server unreachable, ...), 2 bad
// usage, bad input or bad configuration.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/duration.hpp"
#include "core/handler_config.hpp"
#include "core/lane_hash.hpp"
#include "core/text_util.hpp"
#include "core/topic.hpp"
#include "core/version.hpp"
#include "mongo/config.hpp"
#include "mongo/dispatcher.hpp"
#include "mongo/handler_admin.hpp"
#include "mongo/outbox.hpp"
#include "mongo/sequencer.hpp"
#include "mongo/stats.hpp"
#include "mongo/store.hpp"
#include "mongo/util.hpp"

using namespace relaybus;
using namespace relaybus::mongo;
using nlohmann::json;

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

const char* kUsage =
    "usage: relaybus-mongo [settings] COMMAND [args]\n"
    "\n"
    "Commands:\n"
    "  init                                   create collections and indexes (idempotent)\n"
    "  handler create NAME http URL [--options JSON]   (an existing NAME is refused)\n"
    "  handler create NAME pull [--options JSON]\n"
    "  handler create NAME kafka kafka://HOST:PORT[,HOST:PORT...]/TOPIC [--options JSON]\n"
    "  handler alter NAME [--target URL] [--options JSON]   (options merged; null restores a default)\n"
    "  handler drop NAME [--force]            (--force dead-letters its pending deliveries)\n"
    "  handler list\n"
    "  route PATTERN HANDLER [--wire NAME]    route a topic pattern to a handler\n"
    "  unroute PATTERN HANDLER\n"
    "  publish TOPIC PAYLOAD [--key K] [--priority 0..3] [--not-before DURATION|ISO-8601] [--headers JSON]\n"
    "          [--dedupe-key K]               one insert into relay_outbox\n"
    "  publish --batch FILE|-                 JSON lines {topic, payload, key?, priority?, headers?, not_before?,\n"
    "                                         dedupe_key?}: one insertMany into relay_outbox\n"
    "  sequence                               sequence the outbox now (if no instance holds the role)\n"
    "  run                                    the dispatcher (SIGTERM drains, SIGHUP reloads)\n"
    "  replay [--handler NAME] [--id N]...    move dead letters back into delivery\n"
    "  stats                                  per-handler counts as JSON\n"
    "  lane [KEY...]                          key<TAB>fnv1a64<TAB>lane (keys from stdin without args)\n"
    "  version\n"
    "\n"
    "Exit codes: 0 ok, 1 runtime failure, 2 bad usage, input or configuration.\n\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Command-specific options (not settings).
const std::vector<std::string> kCommandOptions = {"key",  "priority", "not_before", "headers", "dedupe_key", "options",
                                                  "wire", "handler",  "id",         "target",  "force",      "batch"};
// Command options that take no value.
const std::vector<std::string> kFlagOptions = {"force"};

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> settings;
  std::multimap<std::string, std::string> options;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      a.positional.insert(a.positional.begin(), "help");
      continue;
    }
    if (s.rfind("--", 0) == 0 && s.size() > 2) {
      std::string name = s.substr(2), value;
      auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (std::find(kFlagOptions.begin(), kFlagOptions.end(), name) != kFlagOptions.end()) {
        value = "true";
      } else {
        if (i + 1 >= argc) throw UsageError("option --" + name + " needs a value");
        value = argv[++i];
      }
      for (char& c : name)
        if (c == '-') c = '_';
      bool cmd = false;
      for (const auto& o : kCommandOptions) cmd |= (o == name);
      if (cmd)
        a.options.emplace(name, value);
      else
        a.settings[name] = value;
      continue;
    }
    a.positional.push_back(s);
  }
  return a;
}

std::string opt(const Args& a, const std::string& name, const std::string& def = "") {
  auto it = a.options.find(name);
  return it == a.options.end() ? def : it->second;
}
bool has_opt(const Args& a, const std::string& name) { return a.options.count(name) > 0; }

void only_options(const Args& a, std::initializer_list<const char*> allowed, const std::string& cmd) {
  for (const auto& [k, v] : a.options) {
    bool ok = false;
    for (const char* x : allowed) ok |= (k == x);
    if (!ok) {
      std::string flag = k;
      for (char& c : flag)
        if (c == '_') c = '-';
      throw UsageError("option --" + flag + " does not apply to " + cmd);
    }
  }
}

int64_t parse_not_before(const std::string& text, int64_t now) {
  std::string why;
  if (auto ms = core::parse_duration_ms(text, &why)) return now + *ms;
  // ISO 8601, UTC: 2024-05-01T12:00:00Z or with .mmm
  struct tm tm {};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest != nullptr) {
    int64_t frac = 0;
    if (*rest == '.') {
      rest++;
      int digits = 0;
      while (isdigit(static_cast<unsigned char>(*rest))) {
        if (digits < 3) frac = frac * 10 + (*rest - '0');
        digits++;
        rest++;
      }
      while (digits < 3) {
        frac *= 10;
        digits++;
      }
    }
    if (strcmp(rest, "Z") == 0) return static_cast<int64_t>(timegm(&tm)) * 1000 + frac;
  }
  throw UsageError("--not-before: " + core::text::quote(text) +
                   " is neither a duration (\"30s\", \"5min\") nor an ISO-8601 UTC time (\"2024-05-01T12:00:00Z\")");
}

// One event's fields, validated as `publish` validates its arguments (the
// batch's lines too). Optional fields: nullptr when absent.
OutboxMessage build_message(const Config& cfg, const std::string& topic, const std::string& payload,
                            const std::string* key, const std::string* priority, const std::string* headers,
                            const std::string* not_before, const std::string* dedupe_key, int64_t now) {
  OutboxMessage m;
  m.topic = topic;
  m.payload_json = payload;
  std::string why;
  if (!core::is_valid_topic(m.topic, &why))
    throw UsageError("invalid topic " + core::text::quote(m.topic) + ": " + why);
  if (static_cast<int64_t>(m.payload_json.size()) > cfg.max_payload_bytes)
    throw UsageError("payload is too large: " + std::to_string(m.payload_json.size()) +
                     " bytes (max_payload_bytes is " + std::to_string(cfg.max_payload_bytes) + ")");
  try {
    json parsed = json::parse(m.payload_json);
    (void)parsed;
  } catch (const json::parse_error& e) {
    throw UsageError(std::string("payload is not valid JSON: ") + e.what());
  }
  if (key != nullptr) {
    if (key->empty()) throw UsageError("key must not be empty (omit --key for an event without an ordering key)");
    if (static_cast<int>(key->size()) > cfg.max_key_bytes)
      throw UsageError("key is too long: " + std::to_string(key->size()) + " bytes (max_key_bytes is " +
                       std::to_string(cfg.max_key_bytes) + ")");
    m.key = *key;
  }
  if (priority != nullptr) {
    const std::string& p = *priority;
    if (p.size() != 1 || p[0] < '0' || p[0] > '3')
      throw UsageError("priority must be 0, 1, 2 or 3 (got " + core::text::quote(p) + ")");
    m.priority = p[0] - '0';
  }
  if (headers != nullptr) {
    m.headers_json = *headers;
    json h;
    try {
      h = json::parse(m.headers_json);
    } catch (const json::parse_error& e) {
      throw UsageError(std::string("headers are not valid JSON: ") + e.what());
    }
    if (!h.is_object()) throw UsageError("headers must be a JSON object");
  }
  if (not_before != nullptr) m.not_before_ms = parse_not_before(*not_before, now);
  if (dedupe_key != nullptr) {
    if (dedupe_key->empty()) throw UsageError("dedupe key must not be empty");
    m.dedupe_key = *dedupe_key;
  }
  return m;
}

// The outbox document of one message, and the line `publish` prints for it.
// The sequencer assigns the event id, the key's seq and the deliveries
// (docs/mongo.md, "The outbox").
json outbox_doc(const OutboxMessage& m, Bson& doc) {
  std::string oid, why;
  if (!build_outbox_doc(m, doc, &oid, &why)) throw UsageError(why);  // not storable as BSON
  json out = {{"outbox_id", oid}};
  if (m.key) {
    out["key"] = *m.key;
    out["lane"] = core::lane_for_key(*m.key);
  }
  return out;
}

// publish --batch FILE ("-": stdin): one JSON object per line, {"topic",
// "payload", "key"?, "priority"?, "headers"?, "not_before"?, "dedupe_key"?}.
// Every line is checked before anything is published (a bad line publishes
// nothing, exit 2 naming the line); then one insertMany into relay_outbox
// (ordered, in line order: the sequencer takes the outbox in _id order, and
// the ObjectIds grow in line order) and one output line per event, in order.
// A store failure (exit 1) may leave a prefix of the lines inserted.
int cmd_publish_batch(Store& store, const Config& cfg, const Args& a) {
  only_options(a, {"batch"}, "publish --batch");
  if (a.positional.size() != 1) throw UsageError("publish --batch FILE takes no TOPIC or PAYLOAD");
  const std::string file = opt(a, "batch");
  std::ifstream f;
  if (file != "-") {
    f.open(file);
    if (!f) throw UsageError("--batch: " + file + " cannot be read");
  }
  std::istream& in = file == "-" ? std::cin : f;
  const int64_t now = wall_ms();
  std::vector<std::unique_ptr<Bson>> docs;
  std::vector<json> lines;
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (core::text::trim(line).empty()) continue;
    try {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::parse_error& e) {
        throw UsageError(std::string("not valid JSON: ") + e.what());
      }
      if (!j.is_object()) throw UsageError("must be a JSON object");
      for (auto& [k, v] : j.items())
        if (k != "topic" && k != "payload" && k != "key" && k != "priority" && k != "headers" && k != "not_before" &&
            k != "dedupe_key")
          throw UsageError("unknown field " + core::text::quote(k));
      if (!j.contains("topic") || !j["topic"].is_string()) throw UsageError("\"topic\" must be a string");
      if (!j.contains("payload")) throw UsageError("\"payload\" is missing");
      auto text = [&](const char* name, std::string* out) -> const std::string* {
        if (!j.contains(name) || j[name].is_null()) return nullptr;
        if (std::string(name) == "priority") {
          if (!j[name].is_number_integer()) throw UsageError("priority must be 0, 1, 2 or 3");
          *out = std::to_string(j[name].get<int64_t>());
        } else if (std::string(name) == "headers") {
          *out = j[name].dump();
        } else {
          if (!j[name].is_string()) throw UsageError(core::text::quote(name) + " must be a string");
          *out = j[name].get<std::string>();
        }
        return out;
      };
      std::string key, priority, headers, not_before, dedupe_key;
      OutboxMessage m = build_message(cfg, j["topic"].get<std::string>(), j["payload"].dump(), text("key", &key),
                                      text("priority", &priority), text("headers", &headers),
                                      text("not_before", &not_before), text("dedupe_key", &dedupe_key), now);
      // Ids strictly growing in line order, each in a microsecond of its own
      // (the sequencer takes the outbox in _id order; two ids of one
      // microsecond would order by their random bytes, and on FerretDB the
      // sequencer reads such a pair as a driver's wrapped counter: outbox_order.cpp).
      json out;
      do {
        docs.push_back(std::make_unique<Bson>());
        out = outbox_doc(m, *docs.back());
        if (!lines.empty() && out["outbox_id"].get<std::string>().substr(0, 16) <=
                                  lines.back()["outbox_id"].get<std::string>().substr(0, 16)) {
          docs.pop_back();
          continue;
        }
        break;
      } while (true);
      lines.push_back(std::move(out));
    } catch (const UsageError& e) {
      throw UsageError("--batch " + file + " line " + std::to_string(n) + ": " + e.what());
    }
  }
  std::vector<const bson_t*> ptrs;
  for (const auto& d : docs) ptrs.push_back(*d);
  store.insert_outbox_many(ptrs);
  for (const auto& l : lines) std::cout << l.dump() << "\n";
  return 0;
}

int cmd_publish(Store& store, const Config& cfg, const Args& a) {
  if (has_opt(a, "batch")) return cmd_publish_batch(store, cfg, a);
  only_options(a, {"key", "priority", "not_before", "headers", "dedupe_key"}, "publish");
  if (a.positional.size() != 3) throw UsageError("publish needs TOPIC and PAYLOAD");
  auto get = [&](const char* name, std::string* out) -> const std::string* {
    if (!has_opt(a, name)) return nullptr;
    *out = opt(a, name);
    return out;
  };
  std::string key, priority, headers, not_before, dedupe_key;
  const int64_t now = wall_ms();
  OutboxMessage m =
      build_message(cfg, a.positional[1], a.positional[2], get("key", &key), get("priority", &priority),
                    get("headers", &headers), get("not_before", &not_before), get("dedupe_key", &dedupe_key), now);
  // One insert into relay_outbox, as an application does.
  Bson doc;
  json out = outbox_doc(m, doc);
  store.insert_outbox(doc);
  std::cout << out.dump() << "\n";
  return 0;
}

// `sequence`: takes the sequencer role if it is free, sequences the outbox
// until it is empty, gives the role back. For operations and tests; `run`
// sequences on its own.
int cmd_sequence(Store& store, const Config& cfg, const Args& a) {
  only_options(a, {}, "sequence");
  const int64_t now = wall_ms();
  LaneDoc top{kSequencerLane, 0, "", 0};
  for (const auto& l : store.read_lanes())
    if (l.lane == kSequencerLane && l.epoch > top.epoch) top = l;
  if (!top.owner.empty() && top.owner != cfg.instance && top.until_ms >= now)
    throw StoreError("the sequencer role is held by " + core::text::quote(top.owner) + " until " +
                         iso8601_ms(top.until_ms) + " (its `run` sequences the outbox)",
                     0);
  LaneDoc mine{kSequencerLane, top.epoch + 1, cfg.instance, now + cfg.lease_ms};
  if (!store.insert_lanes({mine})[0]) throw StoreError("the sequencer role was taken by another instance just now", 0);
  Sequencer seq(store, cfg.instance, cfg.max_key_bytes);
  seq.begin(mine.epoch);
  const int64_t margin = std::max<int64_t>(200, cfg.lease_ms / 5);
  auto holds = [&] { return wall_ms() < mine.until_ms - margin; };
  for (;;) {
    if (!holds()) {  // renew: the same insert of epoch + 1
      LaneDoc next{kSequencerLane, mine.epoch + 1, cfg.instance, wall_ms() + cfg.lease_ms};
      if (!store.insert_lanes({next})[0]) throw StoreError("the sequencer role was lost", 0);
      mine = next;
    }
    const int n = seq.step(cfg.batch_size, wall_ms(), holds);
    // 0 with the role still held: the outbox is empty. 0 because the
    // lease's margin passed during the batch: renew and go on (the batch
    // is redone or continued from what was committed).
    if (n == 0 && holds()) break;
  }
  store.insert_lanes({{kSequencerLane, mine.epoch + 1, "", 0}});  // give it back
  std::cout << json({{"sequenced", seq.sequenced()}, {"outbox_left", store.count_outbox()}}).dump() << "\n";
  return 0;
}

int cmd_handler(Store& store, const Args& a) {
  if (a.positional.size() < 2) throw UsageError("handler needs create, alter, drop or list");
  const std::string& sub = a.positional[1];
  if (sub == "create") {
    only_options(a, {"options"}, "handler create");
    if (a.positional.size() < 4 || a.positional.size() > 5) throw UsageError("handler create needs NAME KIND [TARGET]");
    std::cout << handler_create(store, a.positional[2], a.positional[3],
                                a.positional.size() == 5 ? a.positional[4] : std::string(), opt(a, "options", "{}"))
                     .dump()
              << "\n";
    return 0;
  }
  if (sub == "alter") {
    only_options(a, {"target", "options"}, "handler alter");
    if (a.positional.size() != 3) throw UsageError("handler alter needs NAME");
    std::optional<std::string> target, options;
    if (has_opt(a, "target")) target = opt(a, "target");
    if (has_opt(a, "options")) options = opt(a, "options");
    std::cout << handler_alter(store, a.positional[2], target, options).dump() << "\n";
    return 0;
  }
  if (sub == "drop") {
    only_options(a, {"force"}, "handler drop");
    if (a.positional.size() != 3) throw UsageError("handler drop needs NAME");
    std::cout << handler_drop(store, a.positional[2], has_opt(a, "force"), wall_ms()).dump() << "\n";
    return 0;
  }
  if (sub == "list") {
    std::vector<std::string> bad;
    json out = json::array();
    for (const auto& h : store.load_handlers(&bad))
      out.push_back({{"handler", h.name},
                     {"kind", core::handler_kind_name(h.kind)},
                     {"target", h.target},
                     {"options", json::parse(core::options_public_json(h.kind, h.options))}});
    for (const auto& b : bad) out.push_back({{"invalid", b}});
    std::cout << out.dump() << "\n";
    return 0;
  }
  throw UsageError("handler needs create, alter, drop or list (got " + core::text::quote(sub) + ")");
}

int cmd_route(Store& store, const Args& a, bool add) {
  only_options(a, {"wire"}, add ? "route" : "unroute");
  if (a.positional.size() != 3) throw UsageError(std::string(add ? "route" : "unroute") + " needs PATTERN HANDLER");
  RouteDoc r{a.positional[1], a.positional[2], opt(a, "wire")};
  std::string why;
  if (!core::is_valid_pattern(r.pattern, &why))
    throw UsageError("invalid pattern " + core::text::quote(r.pattern) + ": " + why);
  if (!add) {
    if (!store.drop_route(r.pattern, r.handler)) {
      fprintf(stderr, "relaybus-mongo: error: no route from \"%s\" to \"%s\"\n", r.pattern.c_str(), r.handler.c_str());
      return kExitUsage;
    }
    return 0;
  }
  if (!r.wire_name.empty() && !core::is_valid_topic(r.wire_name, &why)) throw UsageError("invalid wire name: " + why);
  bool found = false;
  for (const auto& h : store.load_handlers(nullptr)) found |= h.name == r.handler;
  if (!found) throw UsageError("handler \"" + r.handler + "\" does not exist");
  store.put_route(r);
  return 0;
}

int cmd_replay(Store& store, const Args& a) {
  only_options(a, {"handler", "id"}, "replay");
  std::string handler = opt(a, "handler");
  if (!handler.empty()) {
    bool found = false;
    for (const auto& h : store.load_handlers(nullptr)) found |= h.name == handler;
    if (!found) throw UsageError("handler \"" + handler + "\" does not exist");
  }
  std::vector<int64_t> ids;
  for (auto [it, end] = a.options.equal_range("id"); it != end; ++it) {
    char* e = nullptr;
    long long v = strtoll(it->second.c_str(), &e, 10);
    if (it->second.empty() || *e != '\0' || v <= 0)
      throw UsageError("--id must be a positive integer (got " + core::text::quote(it->second) + ")");
    ids.push_back(v);
  }
  int64_t n = store.replay(handler, ids, wall_ms());
  std::cout << json({{"replayed", n}}).dump() << "\n";
  return 0;
}

int cmd_stats(Store& store) {
  std::cout << stats_json(store, wall_ms()).dump() << "\n";
  return 0;
}

int cmd_lane(const Args& a) {
  auto print = [](const std::string& key) {
    printf("%s\t%016" PRIx64 "\t%d\n", key.c_str(), core::fnv1a64(key), core::lane_for_key(key));
  };
  if (a.positional.size() > 1) {
    for (size_t i = 1; i < a.positional.size(); i++) print(a.positional[i]);
  } else {
    std::string line;
    while (std::getline(std::cin, line)) print(line);
  }
  return 0;
}

int g_signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  int saved = errno;
  char c = sig == SIGHUP ? 'H' : 'T';
  ssize_t r = write(g_signal_pipe[1], &c, 1);
  (void)r;
  errno = saved;
}

int cmd_run(Store& store, const Config& cfg, const Args& a) {
  only_options(a, {}, "run");
  if (pipe2(g_signal_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
    perror("pipe");
    return kExitRuntime;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  Dispatcher d(cfg, a.settings, store, g_signal_pipe[0]);
  return d.run();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse_args(argc, argv);
  } catch (const UsageError& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n%s", e.what(), kUsage);
    return kExitUsage;
  }
  if (a.positional.empty() || a.positional[0] == "help") {
    printf("%s%s", kUsage, settings_help().c_str());
    return a.positional.empty() ? kExitUsage : 0;
  }
  const std::string cmd = a.positional[0];
  if (cmd == "version") {
    printf("relaybus-mongo %s\n", core::kVersion);
    return 0;
  }
  try {
    if (cmd == "lane") return cmd_lane(a);
    static const std::vector<std::string> known = {"init", "handler", "route", "unroute", "publish",
                                                   "run",  "replay",  "stats", "sequence"};
    if (std::find(known.begin(), known.end(), cmd) == known.end()) throw UsageError("unknown command \"" + cmd + "\"");
    Config cfg;
    std::string why;
    if (!load_config(a.settings, &cfg, &why)) {
      fprintf(stderr, "relaybus-mongo: configuration error: %s\n", why.c_str());
      return kExitUsage;
    }
    LogLevel l;
    if (parse_log_level(cfg.log_level, &l)) set_log_level(l);
    Store store(cfg.uri, cfg.database);
    if (cmd == "init") {
      only_options(a, {}, "init");
      auto created = store.init();
      std::cout << json({{"database", cfg.database}, {"created", created}}).dump() << "\n";
      return 0;
    }
    if (cmd == "handler") return cmd_handler(store, a);
    if (cmd == "route") return cmd_route(store, a, true);
    if (cmd == "unroute") return cmd_route(store, a, false);
    if (cmd == "publish") return cmd_publish(store, cfg, a);
    if (cmd == "replay") return cmd_replay(store, a);
    if (cmd == "sequence") return cmd_sequence(store, cfg, a);
    if (cmd == "stats") return cmd_stats(store);
    if (cmd == "run") return cmd_run(store, cfg, a);
  } catch (const UsageError& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n", e.what());
    return kExitUsage;
  } catch (const BadInput& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n", e.what());
    return kExitUsage;
  } catch (const StoreError& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n", e.what());
    return kExitRuntime;
  } catch (const std::exception& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n", e.what());
    return kExitRuntime;
  }
  return kExitUsage;
}
