// relaybus-mongo: the relaybus sidecar for MongoDB. See docs/mongo.md.
//
//   relaybus-mongo init                               collections and indexes (idempotent)
//   relaybus-mongo handler create NAME http URL [--options JSON]
//   relaybus-mongo handler drop NAME | handler list
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
#include "mongo/outbox.hpp"
#include "mongo/sequencer.hpp"
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
    "  handler create NAME http URL [--options JSON]\n"
    "  handler drop NAME\n"
    "  handler list\n"
    "  route PATTERN HANDLER [--wire NAME]    route a topic pattern to a handler\n"
    "  unroute PATTERN HANDLER\n"
    "  publish TOPIC PAYLOAD [--key K] [--priority 0..3] [--not-before DURATION|ISO-8601] [--headers JSON]\n"
    "          [--dedupe-key K]               one insert into relay_outbox\n"
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
const std::vector<std::string> kCommandOptions = {"key", "priority", "not_before", "headers", "dedupe_key", "options", "wire",
                                                  "handler", "id"};

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

int cmd_publish(Store& store, const Config& cfg, const Args& a) {
  only_options(a, {"key", "priority", "not_before", "headers", "dedupe_key"}, "publish");
  if (a.positional.size() != 3) throw UsageError("publish needs TOPIC and PAYLOAD");
  OutboxMessage m;
  m.topic = a.positional[1];
  m.payload_json = a.positional[2];
  std::string why;
  if (!core::is_valid_topic(m.topic, &why)) throw UsageError("invalid topic " + core::text::quote(m.topic) + ": " + why);
  if (static_cast<int64_t>(m.payload_json.size()) > cfg.max_payload_bytes)
    throw UsageError("payload is too large: " + std::to_string(m.payload_json.size()) + " bytes (max_payload_bytes is " +
                     std::to_string(cfg.max_payload_bytes) + ")");
  try {
    json parsed = json::parse(m.payload_json);
    (void)parsed;
  } catch (const json::parse_error& e) {
    throw UsageError(std::string("payload is not valid JSON: ") + e.what());
  }
  if (has_opt(a, "key")) {
    std::string key = opt(a, "key");
    if (key.empty()) throw UsageError("key must not be empty (omit --key for an event without an ordering key)");
    if (static_cast<int>(key.size()) > cfg.max_key_bytes)
      throw UsageError("key is too long: " + std::to_string(key.size()) + " bytes (max_key_bytes is " +
                       std::to_string(cfg.max_key_bytes) + ")");
    m.key = key;
  }
  if (has_opt(a, "priority")) {
    const std::string p = opt(a, "priority");
    if (p.size() != 1 || p[0] < '0' || p[0] > '3') throw UsageError("priority must be 0, 1, 2 or 3 (got " + core::text::quote(p) + ")");
    m.priority = p[0] - '0';
  }
  if (has_opt(a, "headers")) {
    m.headers_json = opt(a, "headers");
    json h;
    try {
      h = json::parse(m.headers_json);
    } catch (const json::parse_error& e) {
      throw UsageError(std::string("headers are not valid JSON: ") + e.what());
    }
    if (!h.is_object()) throw UsageError("headers must be a JSON object");
  }
  if (has_opt(a, "dedupe_key")) {
    m.dedupe_key = opt(a, "dedupe_key");
    if (m.dedupe_key.empty()) throw UsageError("dedupe key must not be empty");
  }
  const int64_t now = wall_ms();
  if (has_opt(a, "not_before")) m.not_before_ms = parse_not_before(opt(a, "not_before"), now);
  // One insert into relay_outbox, as an application does; the sequencer assigns
  // the event id, the key's seq and the deliveries (docs/mongo.md, "The outbox").
  Bson doc;
  std::string oid;
  if (!build_outbox_doc(m, doc, &oid, &why)) throw UsageError(why);  // not storable as BSON
  store.insert_outbox(doc);
  json out = {{"outbox_id", oid}};
  if (m.key) {
    out["key"] = *m.key;
    out["lane"] = core::lane_for_key(*m.key);
  }
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
    throw StoreError("the sequencer role is held by " + core::text::quote(top.owner) + " until " + iso8601_ms(top.until_ms) +
                         " (its `run` sequences the outbox)", 0);
  LaneDoc mine{kSequencerLane, top.epoch + 1, cfg.instance, now + cfg.lease_ms};
  if (!store.insert_lanes({mine})[0]) throw StoreError("the sequencer role was taken by another instance just now", 0);
  Sequencer seq(store, cfg.instance, cfg.max_key_bytes);
  seq.begin(mine.epoch);
  const int64_t margin = std::max<int64_t>(200, cfg.lease_ms / 5);
  auto holds = [&] { return wall_ms() < mine.until_ms - margin; };
  int64_t total = 0;
  for (;;) {
    if (!holds()) {  // renew: the same insert of epoch + 1
      LaneDoc next{kSequencerLane, mine.epoch + 1, cfg.instance, wall_ms() + cfg.lease_ms};
      if (!store.insert_lanes({next})[0]) throw StoreError("the sequencer role was lost", 0);
      mine = next;
    }
    const int n = seq.step(cfg.batch_size, wall_ms(), holds);
    total += n;
    if (n == 0) break;
  }
  store.insert_lanes({{kSequencerLane, mine.epoch + 1, "", 0}});  // give it back
  std::cout << json({{"sequenced", total}, {"outbox_left", store.count_outbox()}}).dump() << "\n";
  return 0;
}

int cmd_handler(Store& store, const Args& a) {
  if (a.positional.size() < 2) throw UsageError("handler needs create, drop or list");
  const std::string& sub = a.positional[1];
  if (sub == "create") {
    only_options(a, {"options"}, "handler create");
    if (a.positional.size() != 5) throw UsageError("handler create needs NAME KIND TARGET");
    HandlerDoc h;
    h.name = a.positional[2];
    std::string why;
    if (!core::is_valid_handler_name(h.name, &why)) throw UsageError("invalid handler name: " + why);
    if (!core::parse_handler_kind(a.positional[3], &h.kind, &why)) throw UsageError("invalid handler kind: " + why);
    if (h.kind != core::HandlerKind::Http)
      throw UsageError(std::string("handler kind \"") + core::handler_kind_name(h.kind) +
                       "\" is not served by relaybus-mongo (only http; notify is PostgreSQL's LISTEN/NOTIFY)");
    h.target = a.positional[4];
    if (!core::validate_target(h.kind, h.target, false, &why)) throw UsageError("invalid target: " + why);
    h.options_json = opt(a, "options", "{}");
    if (!core::parse_handler_options(h.kind, h.options_json, &h.options, &why)) throw UsageError("invalid options: " + why);
    if (!core::check_secret_strength(h.options, &why)) throw UsageError("invalid options: " + why);
    store.put_handler(h);
    std::cout << json({{"handler", h.name}, {"kind", "http"}, {"target", h.target},
                       {"options", json::parse(core::options_public_json(h.kind, h.options))}})
                     .dump()
              << "\n";
    return 0;
  }
  if (sub == "drop") {
    if (a.positional.size() != 3) throw UsageError("handler drop needs NAME");
    if (!store.drop_handler(a.positional[2])) {
      fprintf(stderr, "relaybus-mongo: error: handler \"%s\" does not exist\n", a.positional[2].c_str());
      return kExitUsage;
    }
    return 0;
  }
  if (sub == "list") {
    std::vector<std::string> bad;
    json out = json::array();
    for (const auto& h : store.load_handlers(&bad))
      out.push_back({{"handler", h.name}, {"kind", core::handler_kind_name(h.kind)}, {"target", h.target},
                     {"options", json::parse(core::options_public_json(h.kind, h.options))}});
    for (const auto& b : bad) out.push_back({{"invalid", b}});
    std::cout << out.dump() << "\n";
    return 0;
  }
  throw UsageError("handler needs create, drop or list (got " + core::text::quote(sub) + ")");
}

int cmd_route(Store& store, const Args& a, bool add) {
  only_options(a, {"wire"}, add ? "route" : "unroute");
  if (a.positional.size() != 3) throw UsageError(std::string(add ? "route" : "unroute") + " needs PATTERN HANDLER");
  RouteDoc r{a.positional[1], a.positional[2], opt(a, "wire")};
  std::string why;
  if (!core::is_valid_pattern(r.pattern, &why)) throw UsageError("invalid pattern " + core::text::quote(r.pattern) + ": " + why);
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
    if (it->second.empty() || *e != '\0' || v <= 0) throw UsageError("--id must be a positive integer (got " + core::text::quote(it->second) + ")");
    ids.push_back(v);
  }
  int64_t n = store.replay(handler, ids, wall_ms());
  std::cout << json({{"replayed", n}}).dump() << "\n";
  return 0;
}

int cmd_stats(Store& store) {
  json out = json::array();
  const int64_t now = wall_ms();
  for (const auto& s : store.stats())
    out.push_back({{"handler", s.handler}, {"pending", s.pending}, {"retrying", s.retrying}, {"dead", s.dead},
                   {"oldest_age_ms", s.oldest_ms > 0 ? now - s.oldest_ms : 0}});
  std::cout << out.dump() << "\n";
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
  store.ping();
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
                                                   "run", "replay", "stats", "sequence"};
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
  } catch (const StoreError& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n", e.what());
    return kExitRuntime;
  } catch (const std::exception& e) {
    fprintf(stderr, "relaybus-mongo: error: %s\n", e.what());
    return kExitRuntime;
  }
  return kExitUsage;
}
