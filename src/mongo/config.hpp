// relaybus-mongo settings: defaults, then a JSON config file, then environment
// variables RELAYBUS_MONGO_<NAME>, then command-line flags --<name> (with
// '_' or '-'). Every setting is listed in kSettings (docs/mongo.md has the table).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace relaybus::mongo {

struct Config {
  std::string uri = "mongodb://127.0.0.1:27017/?serverSelectionTimeoutMS=5000";
  std::string database = "relaybus";
  std::string instance;            // default: <hostname>-<pid>
  int64_t lease_ms = 30000;        // lane lease
  int batch_size = 100;            // deliveries handed to one handler per fetch
  int scan_window = 0;             // rows a fetch reads; 0 = 4 x batch_size (at least 64)
  int64_t poll_interval_ms = 250;  // idle wait between fetches (no change streams on FerretDB)
  int64_t priority_aging_ms = 10000;
  std::string http_allowlist;                     // hosts/CIDRs opened despite the outbound policy
  int max_in_flight = 1024;                       // requests in flight, all handlers
  std::string metrics_listen = "127.0.0.1:9464";  // "" = no endpoint; port 0 = any free port
  std::string log_level = "info";
  int64_t drain_timeout_ms = 30000;  // SIGTERM: how long in-flight requests may finish
  int max_payload_bytes = 1024 * 1024;
  int max_key_bytes = 512;
  std::string api_token;      // bearer token of the pull API; "" = the API is off
  std::string otlp_endpoint;  // spans per traced attempt (docs/tracing.md); "" = none
  std::string otlp_headers;   // name=value,... sent with each span export
  std::string config_file;    // where the file settings came from
};

struct SettingInfo {
  const char* name;
  const char* kind;  // "text", "int", "duration"
  const char* def;
  bool reloadable;
  const char* help;
};
extern const std::vector<SettingInfo> kSettings;

// Builds the config from defaults, the file (flags["config"], else env
// RELAYBUS_MONGO_CONFIG, else none), env and flags (name -> value, already
// split from argv). false with a message naming the source on any unknown
// name or bad value.
bool load_config(const std::map<std::string, std::string>& flags, Config* out, std::string* why);

// Help text listing every setting with its env variable and default.
std::string settings_help();

}  // namespace relaybus::mongo
