#include "mongo/metrics.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/version.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

const std::array<double, 16> Metrics::kBucketsS = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                   0.5,   1,      2.5,   5,    10,    30,    60,  300};

void Metrics::observe_latency(const std::string& handler, double s) {
  auto& h = handlers[handler];
  for (size_t i = 0; i < kBucketsS.size(); i++)
    if (s <= kBucketsS[i]) h.latency_buckets[i]++;
  h.latency_sum_s += s;
}

namespace {
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}
}  // namespace

std::string Metrics::render() const {
  std::string o;
  char buf[256];
  auto counter = [&](const char* name, const char* help) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
  };
  auto gauge = [&](const char* name, const char* help) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
  };
  gauge("relaybus_mongo_info", "Build information.");
  o += std::string("relaybus_mongo_info{version=\"") + core::kVersion + "\"} 1\n";
  struct Field {
    const char* name;
    const char* help;
    uint64_t PerHandler::*field;
  };
  const Field fields[] = {
      {"relaybus_mongo_delivered_total", "Deliveries completed (2xx) and deleted.", &PerHandler::delivered},
      {"relaybus_mongo_retried_total", "Failed attempts scheduled for a retry.", &PerHandler::retried},
      {"relaybus_mongo_dead_total", "Deliveries moved to relay_dead_letters.", &PerHandler::dead},
      {"relaybus_mongo_dropped_total", "Results not completed because the lane's lease was lost.",
       &PerHandler::dropped},
  };
  for (const auto& f : fields) {
    counter(f.name, f.help);
    for (const auto& [h, v] : handlers) {
      snprintf(buf, sizeof buf, "%s{handler=\"%s\"} %llu\n", f.name, label(h).c_str(),
               static_cast<unsigned long long>(v.*(f.field)));
      o += buf;
    }
  }
  o += "# HELP relaybus_mongo_delivery_latency_seconds From publish to completion.\n"
       "# TYPE relaybus_mongo_delivery_latency_seconds histogram\n";
  for (const auto& [h, v] : handlers) {
    for (size_t i = 0; i < kBucketsS.size(); i++) {
      snprintf(buf, sizeof buf, "relaybus_mongo_delivery_latency_seconds_bucket{handler=\"%s\",le=\"%g\"} %llu\n",
               label(h).c_str(), kBucketsS[i], static_cast<unsigned long long>(v.latency_buckets[i]));
      o += buf;
    }
    snprintf(buf, sizeof buf,
             "relaybus_mongo_delivery_latency_seconds_bucket{handler=\"%s\",le=\"+Inf\"} %llu\n"
             "relaybus_mongo_delivery_latency_seconds_sum{handler=\"%s\"} %.6f\n"
             "relaybus_mongo_delivery_latency_seconds_count{handler=\"%s\"} %llu\n",
             label(h).c_str(), static_cast<unsigned long long>(v.delivered), label(h).c_str(), v.latency_sum_s,
             label(h).c_str(), static_cast<unsigned long long>(v.delivered));
    o += buf;
  }
  gauge("relaybus_mongo_breaker_open", "1 while the handler's circuit breaker is open.");
  for (const auto& [h, open] : breaker_open)
    o += "relaybus_mongo_breaker_open{handler=\"" + label(h) + "\"} " + (open ? "1" : "0") + "\n";
  counter("relaybus_mongo_commands_total", "Commands sent to the MongoDB server, by operation.");
  if (commands != nullptr)
    for (const auto& [op, n] : *commands) o += "relaybus_mongo_commands_total{op=\"" + op + "\"} " + std::to_string(n) + "\n";
  auto one = [&](const char* name, const char* help, bool is_counter, double v) {
    if (is_counter)
      counter(name, help);
    else
      gauge(name, help);
    snprintf(buf, sizeof buf, "%s %.17g\n", name, v);
    o += buf;
  };
  one("relaybus_mongo_fetches_total", "Window reads of deliveries.", true, static_cast<double>(fetches));
  one("relaybus_mongo_lanes_taken_total", "Lanes this instance acquired.", true, static_cast<double>(lanes_taken));
  one("relaybus_mongo_lanes_released_total", "Lanes this instance gave back.", true, static_cast<double>(lanes_released));
  one("relaybus_mongo_lanes_lost_total", "Lanes whose lease another instance took over.", true, static_cast<double>(lanes_lost));
  one("relaybus_mongo_store_errors_total", "Failed store operations (retried later).", true, static_cast<double>(store_errors));
  one("relaybus_mongo_lanes_held", "Lanes currently leased by this instance.", false, lanes_held);
  one("relaybus_mongo_in_flight", "HTTP requests in flight.", false, in_flight);
  one("process_resident_memory_bytes", "Resident set size.", false, static_cast<double>(rss_bytes()));
  one("process_start_time_seconds", "Start time since the Unix epoch.", false, started_ms / 1000.0);
  return o;
}

MetricsServer::~MetricsServer() {
  for (auto& c : conns_) close(c.fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

bool MetricsServer::start(const std::string& address, std::string* why) {
  auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  int port = atoi(address.c_str() + colon + 1);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (host == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    *why = "metrics_listen: \"" + host + "\" is not an IPv4 address";
    return false;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(fd, 64) != 0) {
    *why = "metrics_listen " + address + ": " + strerror(errno);
    if (fd >= 0) close(fd);
    return false;
  }
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  bound_ = std::string(ip) + ":" + std::to_string(ntohs(sa.sin_port));
  listen_fd_ = fd;
  return true;
}

void MetricsServer::add_fds(std::vector<pollfd>* fds) const {
  if (listen_fd_ < 0) return;
  fds->push_back({listen_fd_, POLLIN, 0});
  for (const auto& c : conns_) fds->push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
}

void MetricsServer::respond(Conn& c, const Metrics& m, const std::function<bool()>& healthy) {
  std::string line = c.in.substr(0, c.in.find("\r\n"));
  int status = 200;
  std::string body, type = "text/plain; charset=utf-8";
  if (line.rfind("GET /metrics", 0) == 0) {
    body = m.render();
    type = "text/plain; version=0.0.4; charset=utf-8";
  } else if (line.rfind("GET /healthz", 0) == 0) {
    bool ok = healthy();
    status = ok ? 200 : 503;
    body = ok ? "ok\n" : "unhealthy: the store did not answer recently\n";
  } else {
    status = 404;
    body = "not found\n";
  }
  c.out = "HTTP/1.1 " + std::to_string(status) + (status == 200 ? " OK" : status == 404 ? " Not Found" : " Service Unavailable") +
          "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nConnection: close\r\n\r\n" + body;
}

void MetricsServer::on_ready(const std::vector<pollfd>& fds, const Metrics& m, const std::function<bool()>& healthy) {
  if (listen_fd_ < 0) return;
  const int64_t now = monotonic_ms();
  for (const pollfd& p : fds) {
    if (p.revents == 0) continue;
    if (p.fd == listen_fd_) {
      for (int i = 0; i < 16 && conns_.size() < 64; i++) {
        int c = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) break;
        conns_.push_back({c, {}, {}, 0, now});
      }
      continue;
    }
    for (auto& c : conns_) {
      if (c.fd != p.fd) continue;
      if (c.out.empty()) {
        char buf[4096];
        ssize_t n = read(c.fd, buf, sizeof buf);
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        if (n == 0 || (n < 0 && errno != EAGAIN) || c.in.size() > 16384) {
          c.sent = SIZE_MAX;  // close
        } else if (c.in.find("\r\n\r\n") != std::string::npos) {
          respond(c, m, healthy);
        }
      }
      if (!c.out.empty() && c.sent != SIZE_MAX) {
        ssize_t n = write(c.fd, c.out.data() + c.sent, c.out.size() - c.sent);
        if (n > 0) c.sent += static_cast<size_t>(n);
        if ((n < 0 && errno != EAGAIN) || c.sent >= c.out.size()) c.sent = SIZE_MAX;
      }
    }
  }
  // Close finished connections and ones idle for 10 s.
  conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                              [&](Conn& c) {
                                if (c.sent == SIZE_MAX || now - c.opened_ms > 10000) {
                                  close(c.fd);
                                  return true;
                                }
                                return false;
                              }),
               conns_.end());
}

}  // namespace relaybus::mongo
