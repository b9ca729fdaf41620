#include "mongo/metrics.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>
#include <tuple>

#include "core/prometheus.hpp"
#include "core/version.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {
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
      snprintf(buf, sizeof buf, "%s{handler=\"%s\"} %llu\n", f.name, core::prometheus_label(h).c_str(),
               static_cast<unsigned long long>(v.*(f.field)));
      o += buf;
    }
  }
  core::append_prometheus_histogram_head(&o, "relaybus_mongo_delivery_latency_seconds", "From publish to completion.");
  for (const auto& [h, v] : handlers)
    core::append_prometheus_histogram(&o, "relaybus_mongo_delivery_latency_seconds", "handler", h, v.latency);
  auto flags = [&](const char* name, const char* help, const std::map<std::string, bool>& by_handler) {
    gauge(name, help);
    for (const auto& [h, on] : by_handler)
      o += std::string(name) + "{handler=\"" + core::prometheus_label(h) + "\"} " + (on ? "1" : "0") + "\n";
  };
  flags("relaybus_mongo_breaker_open", "1 while the handler's circuit breaker is open.", breaker_open);
  flags("relaybus_mongo_limited", "1 while the handler's deliveries wait for its max_concurrency or rate.", limited);
  counter("relaybus_mongo_held_back_total",
          "Deliveries that waited for a permit of the handler's max_concurrency or rate (this instance's share).");
  for (const auto& [h, n] : held_back)
    o += "relaybus_mongo_held_back_total{handler=\"" + core::prometheus_label(h) + "\"} " + std::to_string(n) + "\n";
  counter("relaybus_mongo_commands_total", "Commands sent to the MongoDB server, by operation.");
  if (commands != nullptr)
    for (const auto& [op, n] : *commands)
      o += "relaybus_mongo_commands_total{op=\"" + op + "\"} " + std::to_string(n) + "\n";
  auto one = [&](const char* name, const char* help, bool is_counter, double v) {
    if (is_counter)
      counter(name, help);
    else
      gauge(name, help);
    snprintf(buf, sizeof buf, "%s %.17g\n", name, v);
    o += buf;
  };
  auto per_handler = [&](const char* name, const char* help, auto value) {
    gauge(name, help);
    for (const auto& [h, b] : backlog) {
      snprintf(buf, sizeof buf, "%s{handler=\"%s\"} %.17g\n", name, core::prometheus_label(h).c_str(),
               static_cast<double>(value(h, b)));
      o += buf;
    }
  };
  using B = Backlog;
  per_handler("relaybus_mongo_pending", "Pending deliveries (refreshed every max(10s, lease)).",
              [](const std::string&, const B& b) { return b.pending; });
  per_handler("relaybus_mongo_ready", "Pending deliveries whose not_before passed.",
              [](const std::string&, const B& b) { return b.ready; });
  per_handler("relaybus_mongo_delayed", "Pending deliveries whose not_before is ahead (scheduled or in backoff).",
              [](const std::string&, const B& b) { return b.delayed; });
  per_handler("relaybus_mongo_retrying", "Pending deliveries with a failed attempt.",
              [](const std::string&, const B& b) { return b.retrying; });
  per_handler("relaybus_mongo_dead", "Dead letters.", [](const std::string&, const B& b) { return b.dead; });
  per_handler("relaybus_mongo_oldest_pending_seconds", "Age of the oldest pending delivery.",
              [](const std::string&, const B& b) { return b.oldest_age_s; });
  per_handler("relaybus_mongo_handler_in_flight", "This instance's HTTP requests in flight or pull leases held.",
              [this](const std::string& h, const B&) {
                auto it = handler_in_flight.find(h);
                return it == handler_in_flight.end() ? int64_t{0} : it->second;
              });
  one("relaybus_mongo_fetches_total", "Window reads of deliveries.", true, static_cast<double>(fetches));
  one("relaybus_mongo_lanes_taken_total", "Lanes this instance acquired.", true, static_cast<double>(lanes_taken));
  one("relaybus_mongo_lanes_released_total", "Lanes this instance gave back.", true,
      static_cast<double>(lanes_released));
  one("relaybus_mongo_lanes_lost_total", "Lanes whose lease was lost: taken over, or renewed too late.", true,
      static_cast<double>(lanes_lost));
  one("relaybus_mongo_store_errors_total", "Failed store operations (retried later).", true,
      static_cast<double>(store_errors));
  one("relaybus_mongo_trace_context_ignored_total",
      "Malformed traceparent or tracestate values the sequencer left out of outbox documents' headers.", true,
      static_cast<double>(trace_context_ignored));
  one("relaybus_mongo_spans_exported_total", "Delivery attempt spans the OTLP collector accepted.", true,
      static_cast<double>(spans_exported));
  one("relaybus_mongo_spans_dropped_total",
      "Delivery attempt spans dropped: the export queue full, or their export failed.", true,
      static_cast<double>(spans_dropped));
  one("relaybus_mongo_lanes_held", "Lanes currently leased by this instance.", false, lanes_held);
  one("relaybus_mongo_in_flight", "HTTP requests in flight.", false, in_flight);
  one("process_resident_memory_bytes", "Resident set size.", false, static_cast<double>(rss_bytes()));
  one("process_start_time_seconds", "Start time since the Unix epoch.", false, started_ms / 1000.0);
  return o;
}

MetricsServer::~MetricsServer() { stop(); }

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
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  api_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || api_fd_ < 0) {
    *why = std::string("metrics_listen: eventfd: ") + strerror(errno);
    close(fd);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (api_fd_ >= 0) close(api_fd_);
    wake_fd_ = api_fd_ = -1;
    return false;
  }
  listen_fd_ = fd;
  // Signals go to the loop's thread (its poll wakes on them): the server's
  // thread starts with them blocked.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  try {
    thread_ = std::thread([this] {
      try {
        run();
      } catch (const std::exception& e) {  // out of memory: /metrics and /healthz stop answering
        log_error("the metrics server stopped", {{"error", e.what()}});
        close_conns();
      }
    });
  } catch (const std::system_error& e) {
    *why = std::string("metrics_listen: cannot start its thread: ") + e.what();
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!thread_.joinable()) {
    for (int* f : {&listen_fd_, &wake_fd_, &api_fd_}) {
      close(*f);
      *f = -1;
    }
    return false;
  }
  return true;
}

void MetricsServer::stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    wake(wake_fd_);
    thread_.join();
  }
  for (int* fd : {&listen_fd_, &wake_fd_, &api_fd_})
    if (*fd >= 0) {
      close(*fd);
      *fd = -1;
    }
}

void MetricsServer::wake(int fd) {
  const uint64_t one = 1;
  if (fd >= 0) (void)!write(fd, &one, sizeof one);  // EAGAIN: already awake
}

void MetricsServer::publish(const Metrics& m, int64_t healthy_within_ms) {
  if (!thread_.joinable()) return;
  auto s = std::make_shared<MetricsSnapshot>();
  s->metrics = m;
  if (m.commands != nullptr) s->commands = *m.commands;
  s->metrics.commands = &s->commands;
  s->healthy_within_ms = healthy_within_ms;
  std::shared_ptr<const MetricsSnapshot> done = std::move(s);
  std::lock_guard<std::mutex> g(mu_);
  snapshot_.swap(done);  // the old one is freed outside the lock
}

void MetricsServer::set_api(ApiHandler api) {
  api_ = std::move(api);
  api_on_ = static_cast<bool>(api_);
}

namespace {

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    default:
      return "Service Unavailable";
  }
}

// The value of a header (name in lower case) in the request head, "" if absent.
std::string header_value(const std::string& head, const std::string& name) {
  size_t pos = 0;
  while ((pos = head.find("\r\n", pos)) != std::string::npos) {
    pos += 2;
    const size_t end = head.find("\r\n", pos);
    std::string line = head.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string n = line.substr(0, colon);
    for (char& ch : n) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
    if (n != name) continue;
    size_t v = colon + 1;
    while (v < line.size() && line[v] == ' ') v++;
    return line.substr(v);
  }
  return "";
}

// The request is complete: its head and Content-Length bytes of body.
bool request_complete(const std::string& in) {
  const size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  const std::string len = header_value(in.substr(0, head_end), "content-length");
  const size_t n = len.empty() ? 0 : strtoul(len.c_str(), nullptr, 10);
  return in.size() >= head_end + 4 + n;
}

std::string http_response(int status, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

void MetricsServer::respond(Conn& c) {
  std::string line = c.in.substr(0, c.in.find("\r\n"));
  std::shared_ptr<const MetricsSnapshot> snap;
  {
    std::lock_guard<std::mutex> g(mu_);
    snap = snapshot_;
  }
  if (line.rfind("GET /metrics", 0) == 0) {
    // Rendered here, from the copy: the loop only copies the counters.
    c.out = snap ? http_response(200, "text/plain; version=0.0.4; charset=utf-8", snap->metrics.render())
                 : http_response(503, "text/plain; charset=utf-8", "starting\n");
  } else if (line.rfind("GET /healthz", 0) == 0) {
    // The loop is stuck or the store does not answer: last_store_ok_ms ages
    // either way (it is set by the loop after a store command succeeded).
    const bool ok = snap && wall_ms() - snap->metrics.last_store_ok_ms < snap->healthy_within_ms;
    c.out = http_response(ok ? 200 : 503, "text/plain; charset=utf-8",
                          ok ? "ok\n" : "unhealthy: the store did not answer recently\n");
  } else if (api_on_ && line.find(" /v1/") != std::string::npos) {
    const size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
    const size_t head_end = c.in.find("\r\n\r\n");
    ApiRequest r{c.id, line.substr(0, sp1),
                 line.substr(sp1 + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp1 - 1),
                 header_value(c.in.substr(0, head_end), "authorization"), c.in.substr(head_end + 4)};
    c.waiting = true;
    {
      std::lock_guard<std::mutex> g(mu_);
      requests_.push_back(std::move(r));
    }
    wake(api_fd_);
  } else {
    c.out = http_response(404, "text/plain; charset=utf-8", "not found\n");
  }
}

void MetricsServer::serve_api() {
  if (api_fd_ < 0) return;
  uint64_t n;
  (void)!read(api_fd_, &n, sizeof n);  // before taking the queue: a later request wakes again
  std::deque<ApiRequest> reqs;
  {
    std::lock_guard<std::mutex> g(mu_);
    reqs.swap(requests_);
  }
  if (reqs.empty()) return;
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const ApiRequest& r : reqs) {
    int status = 404;
    std::string body = "not found";
    if (api_) std::tie(status, body) = api_(r.method, r.path, r.authorization, r.body);
    out.emplace_back(r.conn, http_response(status, "application/json", body + "\n"));
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& a : out) answers_.push_back(std::move(a));
  }
  wake(wake_fd_);
}

void MetricsServer::run() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(conns_.size() < 64 ? POLLIN : 0), 0});
    for (const auto& c : conns_)
      fds.push_back({c.fd, static_cast<short>(c.waiting ? 0 : c.out.empty() ? POLLIN : POLLOUT), 0});
    // 1 s at most: idle connections are closed after 10 s.
    if (poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) break;
    const int64_t now = monotonic_ms();
    if (fds[0].revents & POLLIN) {
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof n);
    }
    std::vector<std::pair<uint64_t, std::string>> answers;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) break;
      answers.swap(answers_);
    }
    for (auto& [id, response] : answers)
      for (auto& c : conns_)  // a connection closed meanwhile: the answer is dropped
        if (c.id == id && c.waiting) {
          c.waiting = false;
          c.out = std::move(response);
        }
    if (fds[1].revents & POLLIN)
      for (int i = 0; i < 16 && conns_.size() < 64; i++) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        conns_.push_back({fd, next_conn_++, {}, {}, 0, now});
      }
    for (size_t k = 2; k < fds.size(); k++) {
      Conn& c = conns_[k - 2];  // new connections were appended after these
      if (fds[k].revents == 0) continue;
      if (c.waiting && (fds[k].revents & (POLLERR | POLLHUP))) c.sent = SIZE_MAX;  // gone: the answer is dropped
      if (c.out.empty() && !c.waiting) {
        char buf[4096];
        ssize_t n = read(c.fd, buf, sizeof buf);
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        if (n == 0 || (n < 0 && errno != EAGAIN) || c.in.size() > (1 << 20)) {
          c.sent = SIZE_MAX;  // close
          continue;
        }
        if (request_complete(c.in)) respond(c);
      }
    }
    for (auto& c : conns_)  // write what is ready (a fresh answer is tried at once)
      if (!c.out.empty() && c.sent != SIZE_MAX) {
        ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += static_cast<size_t>(n);
        if ((n < 0 && errno != EAGAIN) || c.sent >= c.out.size()) c.sent = SIZE_MAX;
      }
    // Close finished connections and ones open for 10 s.
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
  close_conns();
}

void MetricsServer::close_conns() {
  // A request still with the loop is refused (best effort, non-blocking).
  const std::string refused = http_response(503, "application/json", "{\"error\": \"relaybus-mongo is stopping\"}\n");
  for (auto& c : conns_) {
    if (c.waiting) (void)!send(c.fd, refused.data(), refused.size(), MSG_NOSIGNAL);
    close(c.fd);
  }
  conns_.clear();
}

}  // namespace relaybus::mongo
