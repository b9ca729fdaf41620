#pragma once

// A real HTTP/1.1 server on loopback for the engine's tests: one thread, a
// poll() loop, a free port. It records every request and answers each with
// what the test's handler says: a status, headers, a body, after a delay,
// or by dropping the connection. It also counts accepted connections, the
// most connections open at once and the most requests being answered at once
// (received, reply not yet fully written).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace relaybus::testing {

struct RecordedRequest {
  int connection = 0;  // 1 = first accepted connection
  std::string method;
  std::string target;
  std::string version;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  std::string body;

  // Value of the first header with that (lower-case) name, "" if absent.
  std::string header(const std::string& lower_name) const {
    for (const auto& h : headers)
      if (h.first == lower_name) return h.second;
    return "";
  }
  bool has_header(const std::string& lower_name) const {
    for (const auto& h : headers)
      if (h.first == lower_name) return true;
    return false;
  }
};

struct Reply {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  size_t filler_bytes = 0;  // > 0: send this many 'x' bytes as the body instead
  int delay_ms = 0;         // answer (or drop) this long after the request arrived
  bool drop = false;        // close the connection instead of answering
  bool close = false;       // "Connection: close" and close after the reply
};

class TestHttpServer {
 public:
  using Handler = std::function<Reply(const RecordedRequest&)>;

  explicit TestHttpServer(Handler handler = nullptr) : handler_(std::move(handler)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error("socket");
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = 0;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 || listen(listen_fd_, 128) != 0)
      throw std::runtime_error("bind/listen");
    socklen_t len = sizeof sin;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sin), &len);
    port_ = ntohs(sin.sin_port);
    if (pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    // The server thread takes no signals (tests send some to the process).
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    thread_ = std::thread([this] { run(); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }

  ~TestHttpServer() {
    stop_ = true;
    char c = 'x';
    (void)!write(wake_[1], &c, 1);
    thread_.join();
    for (auto& kv : conns_) close(kv.first);
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }

  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& path = "/", const std::string& host = "127.0.0.1") const {
    return "http://" + host + ":" + std::to_string(port_) + path;
  }

  void set_handler(Handler h) {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(h);
  }
  std::vector<RecordedRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int accepts() const { return accepts_; }
  int max_open_connections() const { return max_open_; }
  int max_concurrent_requests() const { return max_active_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Conn {
    int id = 0;
    std::string in;
    std::string out;
    bool busy = false;  // a request is being answered
    bool reply_due_set = false;
    Clock::time_point reply_due;
    Reply reply;
    bool close_after_write = false;
  };

  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
  }
  static const char* reason(int status) {
    switch (status) {
      case 200:
        return "OK";
      case 301:
        return "Moved Permanently";
      case 307:
        return "Temporary Redirect";
      case 400:
        return "Bad Request";
      case 404:
        return "Not Found";
      case 408:
        return "Request Timeout";
      case 429:
        return "Too Many Requests";
      case 500:
        return "Internal Server Error";
      case 503:
        return "Service Unavailable";
      default:
        return "Status";
    }
  }

  // A complete request at the front of c.in: parse, record, ask the handler.
  bool try_parse(Conn& c) {
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) return false;
    RecordedRequest r;
    r.connection = c.id;
    size_t line_end = c.in.find("\r\n");
    const std::string request_line = c.in.substr(0, line_end);
    size_t s1 = request_line.find(' '), s2 = request_line.rfind(' ');
    r.method = request_line.substr(0, s1);
    r.target = request_line.substr(s1 + 1, s2 - s1 - 1);
    r.version = request_line.substr(s2 + 1);
    size_t pos = line_end + 2;
    size_t content_length = 0;
    while (pos < end) {
      size_t e = c.in.find("\r\n", pos);
      const std::string line = c.in.substr(pos, e - pos);
      size_t colon = line.find(':');
      std::string name = lower(line.substr(0, colon));
      std::string value = colon == std::string::npos ? "" : trim(line.substr(colon + 1));
      if (name == "content-length") content_length = std::stoul(value);
      r.headers.emplace_back(std::move(name), std::move(value));
      pos = e + 2;
    }
    if (c.in.size() < end + 4 + content_length) return false;
    r.body = c.in.substr(end + 4, content_length);
    c.in.erase(0, end + 4 + content_length);

    Handler h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(r);
      h = handler_;
    }
    c.reply = h ? h(r) : Reply{};
    c.busy = true;
    c.reply_due = Clock::now() + std::chrono::milliseconds(c.reply.delay_ms);
    c.reply_due_set = true;
    ++active_;
    max_active_ = std::max(max_active_.load(), active_);
    return true;
  }

  void start_reply(Conn& c) {
    c.reply_due_set = false;
    const Reply& rp = c.reply;
    std::string body = rp.filler_bytes > 0 ? std::string(rp.filler_bytes, 'x') : rp.body;
    std::string head = "HTTP/1.1 " + std::to_string(rp.status) + " " + reason(rp.status) + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& kv : rp.headers) head += kv.first + ": " + kv.second + "\r\n";
    if (rp.close) head += "Connection: close\r\n";
    head += "\r\n";
    c.out = head + body;
    c.close_after_write = rp.close;
  }

  void close_conn(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    if (it->second.busy) --active_;
    close(fd);
    conns_.erase(it);
    --open_;
  }

  void run() {
    while (!stop_) {
      std::vector<pollfd> pfds;
      pfds.push_back({wake_[0], POLLIN, 0});
      pfds.push_back({listen_fd_, POLLIN, 0});
      int timeout = -1;
      const auto now = Clock::now();
      for (auto& kv : conns_) {
        Conn& c = kv.second;
        short ev = 0;
        if (!c.busy) ev |= POLLIN;
        if (!c.out.empty()) ev |= POLLOUT;
        if (c.reply_due_set) {
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(c.reply_due - now).count();
          ms = std::max<long long>(0, ms) + 1;
          timeout = timeout < 0 ? static_cast<int>(ms) : std::min(timeout, static_cast<int>(ms));
        }
        pfds.push_back({kv.first, ev, 0});
      }
      if (poll(pfds.data(), pfds.size(), timeout) < 0) continue;
      if (pfds[1].revents & POLLIN) {
        for (;;) {
          int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          Conn c;
          c.id = ++accepts_;
          conns_.emplace(fd, std::move(c));
          ++open_;
          max_open_ = std::max(max_open_.load(), open_);
        }
      }
      for (size_t i = 2; i < pfds.size(); ++i) {
        const int fd = pfds[i].fd;
        auto it = conns_.find(fd);
        if (it == conns_.end()) continue;
        Conn& c = it->second;
        if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          char buf[65536];
          ssize_t n = recv(fd, buf, sizeof buf, 0);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            close_conn(fd);
            continue;
          }
          if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        }
        if (pfds[i].revents & POLLOUT && !c.out.empty()) {
          ssize_t n = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
          if (n < 0 && errno != EAGAIN && errno != EINTR) {
            close_conn(fd);
            continue;
          }
          if (n > 0) c.out.erase(0, static_cast<size_t>(n));
          if (c.out.empty()) {
            c.busy = false;
            --active_;
            if (c.close_after_write) {
              close_conn(fd);
              continue;
            }
          }
        }
      }
      // Due replies, then requests already buffered (pipelined or just read).
      const auto later = Clock::now();
      std::vector<int> to_close;
      for (auto& kv : conns_) {
        Conn& c = kv.second;
        if (c.reply_due_set && c.reply_due <= later) {
          if (c.reply.drop) {
            to_close.push_back(kv.first);
            c.reply_due_set = false;
            continue;
          }
          start_reply(c);
        }
        if (!c.busy) try_parse(c);
        if (c.busy && c.reply_due_set && c.reply_due <= later) {
          if (c.reply.drop) {
            to_close.push_back(kv.first);
            c.reply_due_set = false;
          } else {
            start_reply(c);
          }
        }
      }
      for (int fd : to_close) close_conn(fd);
    }
  }

  Handler handler_;
  mutable std::mutex mu_;
  std::vector<RecordedRequest> requests_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::map<int, Conn> conns_;  // server thread only
  std::atomic<int> accepts_{0};
  int open_ = 0, active_ = 0;  // server thread only
  std::atomic<int> max_open_{0};
  std::atomic<int> max_active_{0};
};

// A port on 127.0.0.1 with nothing listening (bound, then closed).
inline int closed_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin);
  socklen_t len = sizeof sin;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len);
  close(fd);
  return ntohs(sin.sin_port);
}

}  // namespace relaybus::testing
