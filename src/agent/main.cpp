// relaybus-agent: delivers the notify, http and kafka handlers of a database running
// relaybus's managed SQL edition (docs/managed.md, "relaybus-agent").
//
//   relaybus-agent --database CONNINFO [options]
//
// Exit codes: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 bad usage or
// configuration (including a database it must not serve).

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "agent/agent.hpp"
#include "core/json_log.hpp"
#include "core/duration.hpp"
#include "core/version.hpp"

using namespace relaybus;
using namespace relaybus::agent;
using core::log_error;

namespace {

const char* kUsage =
    "usage: relaybus-agent --database CONNINFO [options]\n"
    "\n"
    "  --database CONNINFO         libpq connection string or URI (env RELAYBUS_AGENT_DATABASE);\n"
    "                              e.g. 'host=a,b sslmode=verify-full target_session_attrs=read-write'\n"
    "  --poll-interval DURATION    look for ready deliveries without a wake-up this often (default 1s)\n"
    "  --report-interval DURATION  write this agent's counters into relay.agent_reports this often, for\n"
    "                              relay.workers and relay.handler_stats (default 5s; 0 never)\n"
    "  --batch-size N              deliveries per claim and per notify iteration, 1..10000 (default 1000)\n"
    "  --http-allowlist CSV        hosts and CIDRs http handlers may reach although loopback, private,\n"
    "                              link-local or metadata addresses (env RELAYBUS_AGENT_HTTP_ALLOWLIST)\n"
    "  --ca-file FILE              PEM trust store for https webhooks (default: the system's)\n"
    "  --max-in-flight N           http requests and kafka messages in flight and queued, all handlers\n"
    "                              (default 256)\n"
    "  --notify-payload-limit N    largest NOTIFY sent inline, 200..7999 bytes (default 7900)\n"
    "  --claim-scan-limit N        rows a claim reads per priority class, 100..1000000 (default 1000)\n"
    "  --metrics-addr HOST:PORT    serve GET /metrics (Prometheus) and /healthz there (default: none)\n"
    "  --otlp-endpoint URL         export a span per delivery attempt of traced events over OTLP/HTTP,\n"
    "                              e.g. http://127.0.0.1:4318 (default: none; docs/tracing.md)\n"
    "  --otlp-headers CSV          name=value,... sent with every span export\n"
    "  --drain-timeout DURATION    on SIGTERM, how long requests in flight may finish (default 10s)\n"
    "  --log-level LEVEL           debug, info, warn or error (default info)\n"
    "  --version, --help\n"
    "\n"
    "Exit codes: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 bad usage or configuration.\n";

std::atomic<bool> g_stop{false};
int g_wake_write = -1;

void on_stop(int) {
  g_stop = true;
  if (g_wake_write >= 0) {
    const char c = 1;
    ssize_t ignored = write(g_wake_write, &c, 1);
    (void)ignored;
  }
}

int usage_error(const std::string& msg) {
  fprintf(stderr, "relaybus-agent: %s\n\n%s", msg.c_str(), kUsage);
  return kExitConfig;
}

bool parse_int(const std::string& s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  AgentConfig cfg;
  if (const char* env = getenv("RELAYBUS_AGENT_DATABASE")) cfg.database = env;
  if (const char* env = getenv("RELAYBUS_AGENT_HTTP_ALLOWLIST")) cfg.http_allowlist = env;
  struct IntOption {
    long lo, hi;
    int* target;
  };
  const std::map<std::string, IntOption> int_options = {
      {"--batch-size", {1, 10000, &cfg.batch_size}},
      {"--max-in-flight", {1, 100000, &cfg.max_in_flight}},
      {"--notify-payload-limit", {200, 7999, &cfg.notify_payload_limit}},
      {"--claim-scan-limit", {100, 1000000, &cfg.claim_scan_limit}},
  };
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i], value;
    if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--version") {
      printf("relaybus-agent %s\n", core::kVersion);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return usage_error("unexpected argument " + arg);
    const auto eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (i + 1 >= argc) return usage_error("option " + arg + " needs a value");
      value = argv[++i];
    }
    std::string why;
    if (auto it = int_options.find(arg); it != int_options.end()) {
      long n = 0;
      if (!parse_int(value, it->second.lo, it->second.hi, &n))
        return usage_error(arg + " must be " + std::to_string(it->second.lo) + ".." + std::to_string(it->second.hi));
      *it->second.target = static_cast<int>(n);
    } else if (arg == "--database") {
      cfg.database = value;
    } else if (arg == "--poll-interval" || arg == "--drain-timeout") {
      auto ms = core::parse_duration_ms(value, &why);
      if (!ms || *ms < 1 || *ms > 3600000) return usage_error(arg + " must be a duration from 1ms to 1h: " + value);
      (arg == "--poll-interval" ? cfg.poll_interval_ms : cfg.drain_timeout_ms) = *ms;
    } else if (arg == "--report-interval") {
      auto ms = core::parse_duration_ms(value, &why);
      if (!ms || (*ms != 0 && (*ms < 100 || *ms > 3600000)))
        return usage_error(arg + " must be 0 or a duration from 100ms to 1h: " + value);
      cfg.report_interval_ms = *ms;
    } else if (arg == "--http-allowlist") {
      cfg.http_allowlist = value;
    } else if (arg == "--metrics-addr") {
      cfg.metrics_addr = value;
    } else if (arg == "--otlp-endpoint") {
      std::string url;
      if (!core::otlp_traces_url(value, &url, &why)) return usage_error("--otlp-endpoint: " + why);
      cfg.otlp_endpoint = value;
    } else if (arg == "--otlp-headers") {
      if (!core::parse_otlp_headers(value, &cfg.otlp_headers, &why)) return usage_error("--otlp-headers: " + why);
    } else if (arg == "--ca-file") {
      cfg.ca_file = value;
    } else if (arg == "--log-level") {
      core::LogLevel level;
      if (!core::parse_log_level(value, &level)) return usage_error("--log-level must be debug, info, warn or error");
      core::set_log_level(level);
    } else {
      return usage_error("unknown option " + arg);
    }
  }
  if (cfg.database.empty()) return usage_error("--database (or RELAYBUS_AGENT_DATABASE) is required");

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    log_error("pipe2 failed", {{"error", strerror(errno)}});
    return kExitRuntime;
  }
  g_wake_write = pipe_fds[1];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // The loop catches the database's errors; anything else is a bug, said in
  // one line rather than an abort.
  try {
    Agent agent(cfg);
    return agent.run(g_stop, pipe_fds[0]);
  } catch (const std::exception& e) {
    log_error("relaybus-agent failed", {{"error", e.what()}});
    return kExitRuntime;
  }
}
