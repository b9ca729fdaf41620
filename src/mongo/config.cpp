#include "mongo/config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/duration.hpp"
#include "core/outbound_policy.hpp"
#include "core/span_exporter.hpp"
#include "core/text_util.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

const std::vector<SettingInfo> kSettings = {
    {"config", "text", "", false, "JSON file of settings (an object of the names below)"},
    {"uri", "text", "mongodb://127.0.0.1:27017/?serverSelectionTimeoutMS=5000", false, "MongoDB connection string"},
    {"database", "text", "relaybus", false, "database holding the relay_* collections"},
    {"instance", "text", "<hostname>-<pid>", false, "this instance's name (lane owner)"},
    {"lease", "duration", "30s", true, "lane lease; renewed every lease/3, taken over after it lapses"},
    {"batch_size", "int", "100", true, "most deliveries one fetch hands to a handler (1..10000)"},
    {"scan_window", "int", "0", true, "rows one fetch reads (0: 4 x batch_size, at least 64)"},
    {"poll_interval", "duration", "250ms", true, "idle wait between fetches"},
    {"priority_aging", "duration", "10s", true, "waiting time that counts one priority class (0: strict)"},
    {"http_allowlist", "text", "", true, "hosts and CIDRs http handlers may call although loopback/private"},
    {"max_in_flight", "int", "1024", false, "HTTP requests in flight, all handlers (1..4096)"},
    {"metrics_listen", "text", "127.0.0.1:9464", false, "address of /metrics and /healthz (\"\": off; port 0: any)"},
    {"log_level", "text", "info", true, "debug, info, warn or error"},
    {"drain_timeout", "duration", "30s", true, "on SIGTERM, how long in-flight requests may finish"},
    {"max_payload_bytes", "int", "1048576", true, "largest payload publish accepts (JSON text bytes)"},
    {"max_key_bytes", "int", "512", true, "longest ordering key"},
    {"api_token", "text", "", true, "bearer token of the pull API on metrics_listen (\"\": the API is off)"},
    {"otlp_endpoint", "text", "", true, "OTLP/HTTP endpoint for a span per traced delivery attempt (\"\": none)"},
    {"otlp_headers", "text", "", true, "name=value,... headers sent with each span export"},
};

namespace {

std::string env_name(const std::string& name) {
  std::string e = "RELAYBUS_MONGO_";
  for (char c : name) e += static_cast<char>(c == '-' ? '_' : toupper(static_cast<unsigned char>(c)));
  return e;
}

bool parse_int(const std::string& v, int64_t lo, int64_t hi, int64_t* out) {
  std::string t(core::text::trim(v));
  if (t.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(t.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || x < lo || x > hi) return false;
  *out = x;
  return true;
}

bool apply(Config* c, const std::string& name, const std::string& value, std::string* why) {
  auto bad = [&](const std::string& what) {
    *why = "setting \"" + name + "\": " + what + " (got " + core::text::quote(value) + ")";
    return false;
  };
  auto dur = [&](int64_t lo, int64_t hi, int64_t* out) {
    std::string w;
    auto ms = core::parse_duration_ms(value, &w);
    if (!ms) return bad("not a duration: " + w);
    if (*ms < lo || *ms > hi)
      return bad("must be between " + core::format_duration_ms(lo) + " and " + core::format_duration_ms(hi));
    *out = *ms;
    return true;
  };
  auto integer = [&](int64_t lo, int64_t hi, int* out) {
    int64_t x;
    if (!parse_int(value, lo, hi, &x))
      return bad("must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi));
    *out = static_cast<int>(x);
    return true;
  };
  if (name == "uri") {
    if (value.rfind("mongodb://", 0) != 0 && value.rfind("mongodb+srv://", 0) != 0)
      return bad("must start with mongodb:// or mongodb+srv://");
    c->uri = value;
  } else if (name == "database") {
    if (value.empty() || value.size() > 63 || value.find_first_of("/\\. \"$") != std::string::npos)
      return bad("must be 1..63 characters without / \\ . space \" $");
    c->database = value;
  } else if (name == "instance") {
    if (value.empty() || value.size() > 200) return bad("must be 1..200 characters");
    c->instance = value;
  } else if (name == "lease") {
    return dur(1000, 3600000, &c->lease_ms);
  } else if (name == "batch_size") {
    return integer(1, 10000, &c->batch_size);
  } else if (name == "scan_window") {
    return integer(0, 100000, &c->scan_window);
  } else if (name == "poll_interval") {
    return dur(10, 3600000, &c->poll_interval_ms);
  } else if (name == "priority_aging") {
    return dur(0, 7 * core::kMsPerDay, &c->priority_aging_ms);
  } else if (name == "http_allowlist") {
    core::Allowlist a;
    std::string w;
    if (!core::parse_allowlist(value, &a, &w)) return bad(w);
    c->http_allowlist = value;
  } else if (name == "max_in_flight") {
    return integer(1, 4096, &c->max_in_flight);
  } else if (name == "metrics_listen") {
    if (!value.empty()) {
      auto colon = value.rfind(':');
      int64_t port;
      if (colon == std::string::npos || colon == 0 || !parse_int(value.substr(colon + 1), 0, 65535, &port))
        return bad("must be HOST:PORT (an IPv4 address) or empty");
    }
    c->metrics_listen = value;
  } else if (name == "log_level") {
    LogLevel l;
    if (!parse_log_level(value, &l)) return bad("must be debug, info, warn or error");
    c->log_level = value;
  } else if (name == "drain_timeout") {
    return dur(0, 3600000, &c->drain_timeout_ms);
  } else if (name == "max_payload_bytes") {
    return integer(1, 15 * 1024 * 1024, &c->max_payload_bytes);
  } else if (name == "max_key_bytes") {
    return integer(1, 2048, &c->max_key_bytes);
  } else if (name == "api_token") {
    if (!value.empty() && value.size() < 16) return bad("must be empty or at least 16 characters");
    c->api_token = value;
  } else if (name == "otlp_endpoint") {
    std::string url, w;
    if (!value.empty() && !core::otlp_traces_url(value, &url, &w)) return bad(w);
    c->otlp_endpoint = value;
  } else if (name == "otlp_headers") {
    std::vector<std::pair<std::string, std::string>> h;
    std::string w;
    if (!core::parse_otlp_headers(value, &h, &w)) return bad(w);
    c->otlp_headers = value;
  } else {
    *why = "unknown setting \"" + name + "\"";
    return false;
  }
  return true;
}

bool known(const std::string& name) {
  for (const auto& s : kSettings)
    if (name == s.name) return true;
  return false;
}

}  // namespace

bool load_config(const std::map<std::string, std::string>& flags, Config* out, std::string* why) {
  Config c;
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  c.instance = std::string(host) + "-" + std::to_string(getpid());

  std::string file;
  if (auto it = flags.find("config"); it != flags.end()) {
    file = it->second;
  } else if (const char* e = getenv("RELAYBUS_MONGO_CONFIG"); e != nullptr && *e) {
    file = e;
  }
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) {
      *why = "config file " + file + ": cannot be read";
      return false;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ss.str());
    } catch (const std::exception& e) {
      *why = "config file " + file + ": " + e.what();
      return false;
    }
    if (!j.is_object()) {
      *why = "config file " + file + ": must be a JSON object";
      return false;
    }
    for (auto& [k, v] : j.items()) {
      std::string name = k;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      if (name == "config" || !known(name)) {
        *why = "config file " + file + ": unknown setting \"" + k + "\"";
        return false;
      }
      std::string value = v.is_string() ? v.get<std::string>() : v.dump();
      std::string w;
      if (!apply(&c, name, value, &w)) {
        *why = "config file " + file + ": " + w;
        return false;
      }
    }
    c.config_file = file;
  }
  for (const auto& s : kSettings) {
    if (std::string(s.name) == "config") continue;
    if (const char* e = getenv(env_name(s.name).c_str()); e != nullptr) {
      std::string w;
      if (!apply(&c, s.name, e, &w)) {
        *why = "environment " + env_name(s.name) + ": " + w;
        return false;
      }
    }
  }
  for (const auto& [k, v] : flags) {
    if (k == "config") continue;
    std::string w;
    if (!known(k)) {
      *why = "unknown option --" + k;
      return false;
    }
    if (!apply(&c, k, v, &w)) {
      *why = "option --" + k + ": " + w;
      return false;
    }
  }
  *out = c;
  return true;
}

std::string settings_help() {
  std::string out = "Settings (flag / environment / config file key, default):\n";
  for (const auto& s : kSettings) {
    out += "  --";
    std::string flag = s.name;
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    out += flag + "  " + env_name(s.name) + "  [" + s.def + "]" + (s.reloadable ? " (SIGHUP)" : "") + "\n      " +
           s.help + "\n";
  }
  return out;
}

}  // namespace relaybus::mongo
