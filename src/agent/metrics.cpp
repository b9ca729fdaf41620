#include "agent/metrics.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/prometheus.hpp"
#include "core/version.hpp"

namespace relaybus::agent {

using core::prometheus_label;

std::string Metrics::report_json() {
  std::lock_guard<std::mutex> lock(mu);
  nlohmann::json report = nlohmann::json::object();
  uint64_t delivered = 0, failed = 0;
  for (const auto& [name, h] : handlers) {
    nlohmann::json c = {{"delivered", h.delivered},
                        {"notified", h.notified},
                        {"retried", h.retried},
                        {"dead", h.dead},
                        {"sends", h.sends},
                        {"delivered_after_gap", h.delivered_after_gap},
                        {"held_back", h.held_back},
                        {"limited", h.limited},
                        {"breaker_open", h.breaker_open},
                        {"http_2xx", h.http_status[2]},
                        {"http_3xx", h.http_status[3]},
                        {"http_4xx", h.http_status[4]},
                        {"http_5xx", h.http_status[5]},
                        {"http_errors", h.http_status[0] + h.http_status[1]}};
    const double p50 = h.latency.quantile_ms(0.5), p99 = h.latency.quantile_ms(0.99);
    if (p50 >= 0) c["latency_p50_ms"] = p50;
    if (p99 >= 0) c["latency_p99_ms"] = p99;
    report[name] = std::move(c);
    delivered += h.delivered + h.notified;
    failed += h.retried + h.dead;
  }
  report[""] = {{"delivered", delivered}, {"failed", failed}, {"last_error", last_error}, {"version", core::kVersion}};
  return report.dump();
}

std::string Metrics::render() {
  std::lock_guard<std::mutex> lock(mu);
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  head("relaybus_agent_info", "gauge", "Build information.");
  o += std::string("relaybus_agent_info{version=\"") + core::kVersion + "\"} 1\n";
  head("relaybus_agent_up", "gauge", "1 while connected to the database.");
  o += std::string("relaybus_agent_up ") + (connected ? "1" : "0") + "\n";
  head("relaybus_agent_spans_exported_total", "counter", "Delivery attempt spans the OTLP collector accepted.");
  o += "relaybus_agent_spans_exported_total " + std::to_string(spans_exported) + "\n";
  head("relaybus_agent_spans_dropped_total", "counter",
       "Delivery attempt spans dropped: the export queue full, or their export failed.");
  o += "relaybus_agent_spans_dropped_total " + std::to_string(spans_dropped) + "\n";
  struct Field {
    const char* name;
    const char* type;
    const char* help;
    uint64_t PerHandler::*member;
  };
  static const Field kFields[] = {
      {"relaybus_agent_delivered_total", "counter", "http and kafka deliveries settled as delivered.",
       &PerHandler::delivered},
      {"relaybus_agent_retried_total", "counter",
       "Attempts that failed and were scheduled again (notify: a delivery that failed alone).", &PerHandler::retried},
      {"relaybus_agent_dead_total", "counter",
       "Deliveries moved to the dead letters (notify: a delivery that failed alone).", &PerHandler::dead},
      {"relaybus_agent_stale_total", "counter", "http and kafka results refused because the lease was no longer held.",
       &PerHandler::stale},
      {"relaybus_agent_sends_total", "counter", "http requests and kafka produces that ended (a response, an error).",
       &PerHandler::sends},
      {"relaybus_agent_delivered_after_gap_total", "counter",
       "kafka messages acknowledged after an earlier message of their key in flight failed for good.",
       &PerHandler::delivered_after_gap},
      {"relaybus_agent_handler_in_flight", "gauge", "http requests or kafka messages of the handler in flight.",
       &PerHandler::in_flight},
      {"relaybus_agent_notified_total", "counter", "NOTIFYs sent for notify handlers.", &PerHandler::notified},
      {"relaybus_agent_held_back_total", "counter",
       "Deliveries that waited for a permit of the handler's max_concurrency or rate.", &PerHandler::held_back},
      {"relaybus_agent_limit_slots", "gauge", "max_concurrency slots of the handler this agent holds.",
       &PerHandler::limit_slots},
      {"relaybus_agent_limit_agents", "gauge",
       "Agents sharing the handler's max_concurrency and rate (0: this one has no work for it).",
       &PerHandler::limit_agents},
  };
  for (const Field& f : kFields) {
    head(f.name, f.type, f.help);
    for (const auto& [h, c] : handlers)
      o += std::string(f.name) + "{handler=\"" + prometheus_label(h) + "\"} " + std::to_string(c.*(f.member)) + "\n";
  }
  head("relaybus_agent_http_responses_total", "counter",
       "http attempts by the class of their response's status (error: none, or not 2xx to 5xx).");
  static const char* const kClasses[] = {"error", nullptr, "2xx", "3xx", "4xx", "5xx"};
  for (const auto& [h, c] : handlers)
    for (int cls : {2, 3, 4, 5, 0})
      o += "relaybus_agent_http_responses_total{handler=\"" + prometheus_label(h) + "\",class=\"" + kClasses[cls] +
           "\"} " + std::to_string(c.http_status[cls] + (cls == 0 ? c.http_status[1] : 0)) + "\n";
  core::append_prometheus_histogram_head(&o, "relaybus_agent_delivery_latency_seconds",
                                         "http and kafka: from publish to settled as delivered.");
  for (const auto& [h, c] : handlers)
    if (c.latency.count > 0 || c.delivered > 0)
      core::append_prometheus_histogram(&o, "relaybus_agent_delivery_latency_seconds", "handler", h, c.latency);
  auto flag = [&](const char* name, const char* help, bool PerHandler::*member) {
    head(name, "gauge", help);
    for (const auto& [h, c] : handlers)
      o += std::string(name) + "{handler=\"" + prometheus_label(h) + "\"} " + (c.*member ? "1" : "0") + "\n";
  };
  flag("relaybus_agent_breaker_open", "1 while the http or kafka handler's circuit breaker is open.",
       &PerHandler::breaker_open);
  flag("relaybus_agent_limited", "1 while the handler's deliveries wait for its max_concurrency or rate.",
       &PerHandler::limited);
  auto one = [&](const char* name, const char* type, const char* help, uint64_t v) {
    head(name, type, help);
    o += std::string(name) + " " + std::to_string(v) + "\n";
  };
  one("relaybus_agent_connect_failures_total", "counter", "Failed connection attempts.", connect_failures);
  one("relaybus_agent_connections_lost_total", "counter", "Connections lost while in use.", connections_lost);
  one("relaybus_agent_statement_errors_total", "counter", "Statements that failed on a live connection.",
      statement_errors);
  one("relaybus_agent_in_flight", "gauge", "http requests and kafka messages in flight, all handlers.", in_flight);
  return o;
}

bool MetricsServer::start(const std::string& address, int* port, std::string* why) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    *why = "expected HOST:PORT, got \"" + address + "\"";
    return false;
  }
  std::string host = address.substr(0, colon), service = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    *why = std::string("cannot resolve ") + address + ": " + gai_strerror(rc);
    return false;
  }
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 16) != 0) {
    *why = std::string("cannot listen on ") + address + ": " + strerror(errno);
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return false;
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  *port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    *why = std::string("pipe2: ") + strerror(errno);
    close(fd);
    return false;
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { serve(); });
  return true;
}

void MetricsServer::stop() {
  if (!thread_.joinable()) return;
  const char c = 1;
  ssize_t ignored = write(stop_pipe_[1], &c, 1);
  (void)ignored;
  thread_.join();
  close(listen_fd_);
  close(stop_pipe_[0]);
  close(stop_pipe_[1]);
  listen_fd_ = -1;
}

void MetricsServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    // A scraper that stalls holds up only the next scrape, for 2 s at most.
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::string req;
    char buf[1024];
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 8192) {
      const ssize_t n = read(c, buf, sizeof buf);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string status = "404 Not Found", type = "text/plain", body = "not found\n";
    if (req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0) {
      status = "200 OK";
      type = "text/plain; version=0.0.4";
      body = metrics_.render();
    } else if (req.rfind("GET /healthz ", 0) == 0) {
      bool up;
      {
        std::lock_guard<std::mutex> lock(metrics_.mu);
        up = metrics_.connected;
      }
      status = up ? "200 OK" : "503 Service Unavailable";
      body = up ? "ok\n" : "not connected\n";
    }
    const std::string resp = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                             body;
    size_t off = 0;
    while (off < resp.size()) {
      const ssize_t n = send(c, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    close(c);
  }
}

}  // namespace relaybus::agent
