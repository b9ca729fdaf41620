#include "http_engine.hpp"

#include <curl/curl.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#ifdef __linux__
#include <sys/epoll.h>
#endif
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>

#include "backoff.hpp"
#include "text_util.hpp"
#include "version.hpp"

namespace relaybus::core {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDefaultHandlerLimit = 16;
constexpr long kMaxRedirects = 5;

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

int64_t now_epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Blocks every signal for the lifetime of the guard, so that a thread that
// libcurl starts meanwhile (the threaded DNS resolver) inherits a mask that
// keeps the host process's signals (a PostgreSQL backend's SIGTERM, SIGUSR1,
// SIGALRM...) away from it. Signals that arrive meanwhile stay pending and
// are delivered when the old mask comes back, except a SIGPIPE raised by a
// write of libcurl/OpenSSL to a closed connection: it is consumed (the way
// libpq does it), since a default SIGPIPE disposition would kill the process.
//
// Guards nest: only the outermost one changes the mask (an engine call inside
// HttpEngine::Batch costs no system calls for it).
thread_local int signal_guard_depth = 0;

class SignalGuard {
 public:
  SignalGuard() {
    if (signal_guard_depth++ > 0) return;
    sigset_t all;
    sigfillset(&all);
    active_ = pthread_sigmask(SIG_BLOCK, &all, &old_) == 0;
    if (active_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      sigpipe_was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    }
  }
  ~SignalGuard() {
    --signal_guard_depth;
    if (!active_) return;
    if (!sigpipe_was_pending_ && sigismember(&old_, SIGPIPE) != 1) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        sigset_t pipe_only;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_only, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  sigset_t old_;
  bool active_ = false;
  bool sigpipe_was_pending_ = false;
};

bool curl_global_ready() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    SignalGuard guard;
    ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  });
  return ok;
}

bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

bool starts_with_icase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && text::iequals(s.substr(0, prefix.size()), prefix);
}

// The host of a URL as libcurl parses it ("" if it cannot).
std::string url_host(const char* url) {
  std::string host;
  if (url == nullptr || *url == '\0') return host;
  CURLU* u = curl_url();
  if (u == nullptr) return host;
  if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK) {
    char* h = nullptr;
    if (curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK && h != nullptr) host = h;
    curl_free(h);
  }
  curl_url_cleanup(u);
  return host;
}

std::string errno_text(long err) {
  switch (err) {
    case ECONNREFUSED:
      return "connection refused";
    case ECONNRESET:
      return "connection reset by peer";
    case EPIPE:
      return "connection closed by peer";
    case ENETUNREACH:
      return "network unreachable";
    case EHOSTUNREACH:
      return "host unreachable";
    case ETIMEDOUT:
      return "connection timed out";
    default:
      return "";
  }
}

}  // namespace

bool valid_request_header(const std::string& name, const std::string& value, std::string* why) {
  bool ok = !name.empty();
  for (char c : name) ok = ok && is_tchar(c);
  if (!ok) {
    text::set_why(why, "invalid header name " + text::quote(name));
    return false;
  }
  for (char c : value) {
    if (c == '\r' || c == '\n' || c == '\0') {
      text::set_why(why, "value of header " + text::quote(name) + " contains CR, LF or NUL");
      return false;
    }
  }
  return true;
}

struct HttpEngine::Transfer {
  HttpEngine* engine = nullptr;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  HttpRequest req;
  Clock::time_point start;
  char errbuf[CURL_ERROR_SIZE] = {};

  std::string body;             // kept part of the response body
  uint64_t response_bytes = 0;  // all of it
  bool cut_off = false;         // max_drain_bytes reached, transfer aborted
  std::string retry_after;      // Retry-After of the latest response

  // Outbound policy, per hop (a followed redirect starts a new hop).
  std::string hop_url;
  int hop_opened = 0;
  int hop_refused = 0;
  std::string refusal;
  bool reuse_refused = false;  // the prereq check refused the connection's address
  bool gate_refused = false;   // the send gate refused the request (HttpEngine::set_send_gate)

  Transfer() = default;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer() {  // the easy handle must already be out of the multi handle
    if (easy != nullptr) curl_easy_cleanup(easy);
    curl_slist_free_all(headers);
  }
};

// libcurl's C callbacks. None lets an exception out.
struct HttpEngineCallbacks {
  static int socket_cb(CURL*, curl_socket_t fd, int what, void* userp, void*) {
    static_cast<HttpEngine*>(userp)->socket_changed(fd, what);
    return 0;
  }

  static size_t write_cb(char* ptr, size_t size, size_t nmemb, void* userdata) {
    auto* t = static_cast<HttpEngine::Transfer*>(userdata);
    const size_t n = size * nmemb;
    try {
      t->response_bytes += n;
      const size_t cap = t->engine->options_.max_response_bytes;
      if (t->body.size() < cap) t->body.append(ptr, std::min(n, cap - t->body.size()));
    } catch (...) {
      // Out of memory for the kept part: go on discarding.
    }
    if (t->response_bytes > t->engine->options_.max_drain_bytes) {
      t->cut_off = true;
      return n == 0 ? 1 : 0;  // anything but n aborts with CURLE_WRITE_ERROR
    }
    return n;
  }

  static size_t header_cb(char* buffer, size_t size, size_t nitems, void* userdata) {
    auto* t = static_cast<HttpEngine::Transfer*>(userdata);
    const size_t n = size * nitems;
    try {
      std::string_view line(buffer, n);
      if (starts_with_icase(line, "HTTP/")) {
        t->retry_after.clear();  // a new response (1xx, redirect hop, final)
      } else if (starts_with_icase(line, "retry-after:")) {
        t->retry_after = std::string(text::trim(line.substr(12)));
      }
    } catch (...) {
    }
    return n;
  }

  static curl_socket_t opensocket_cb(void* clientp, curlsocktype purpose, curl_sockaddr* address) {
    auto* t = static_cast<HttpEngine::Transfer*>(clientp);
    try {
      if (purpose != CURLSOCKTYPE_IPCXN) return CURL_SOCKET_BAD;
      char* url = nullptr;
      curl_easy_getinfo(t->easy, CURLINFO_EFFECTIVE_URL, &url);
      const std::string current = url != nullptr ? url : "";
      if (current != t->hop_url) {
        t->hop_url = current;
        t->hop_opened = 0;
        t->hop_refused = 0;
        t->refusal.clear();
      }
      std::string why;
      if (!address_allowed(&address->addr, static_cast<socklen_t>(address->addrlen), t->engine->host_of(url),
                           t->engine->options_.allow, &why)) {
        ++t->hop_refused;
        if (t->refusal.empty()) t->refusal = std::move(why);
        return CURL_SOCKET_BAD;
      }
      const int fd = socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
      if (fd >= 0) ++t->hop_opened;
      return fd;
    } catch (...) {
      return CURL_SOCKET_BAD;
    }
  }

#if LIBCURL_VERSION_NUM >= 0x075000  // 7.80.0
  // Before every request (each hop), on a new or a reused connection: the
  // address it goes to must be allowed by the allow-list in force now. A
  // connection opened under a wider list is not used once the list narrowed.
  static int prereq_cb(void* clientp, char* primary_ip, char*, int primary_port, int) {
    auto* t = static_cast<HttpEngine::Transfer*>(clientp);
    const int verdict = address_check(t, primary_ip, primary_port);
    if (verdict != CURL_PREREQFUNC_OK) return verdict;
    try {
      if (t->engine->send_gate_ && !t->engine->send_gate_(t->req.tag)) {
        t->gate_refused = true;
        return CURL_PREREQFUNC_ABORT;
      }
    } catch (...) {
      t->gate_refused = true;
      return CURL_PREREQFUNC_ABORT;
    }
    return CURL_PREREQFUNC_OK;
  }

  static int address_check(HttpEngine::Transfer* t, const char* primary_ip, int primary_port) {
    try {
      sockaddr_storage ss{};
      socklen_t len = 0;
      auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
      if (primary_ip != nullptr && inet_pton(AF_INET, primary_ip, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(static_cast<uint16_t>(primary_port));
        len = sizeof(sockaddr_in);
      } else if (primary_ip != nullptr && inet_pton(AF_INET6, primary_ip, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(static_cast<uint16_t>(primary_port));
        len = sizeof(sockaddr_in6);
      } else {
        return CURL_PREREQFUNC_OK;  // not an IP connection (none is made otherwise)
      }
      char* url = nullptr;
      curl_easy_getinfo(t->easy, CURLINFO_EFFECTIVE_URL, &url);
      std::string why;
      if (address_allowed(reinterpret_cast<sockaddr*>(&ss), len, t->engine->host_of(url), t->engine->options_.allow,
                          &why))
        return CURL_PREREQFUNC_OK;
      t->reuse_refused = true;
      t->refusal = std::move(why);
      // Close it rather than keep it for the next request (submit clears this
      // again before the handle is used for another one).
      curl_easy_setopt(t->easy, CURLOPT_FORBID_REUSE, 1L);
      return CURL_PREREQFUNC_ABORT;
    } catch (...) {
      t->reuse_refused = true;
      t->refusal = "the outbound policy could not be checked";
      return CURL_PREREQFUNC_ABORT;
    }
  }
#endif
};

const std::string& HttpEngine::host_of(const char* url) {
  const std::string_view u = url != nullptr ? url : "";
  if (u != host_url_) {
    std::string host = url_host(url), key(u);  // may throw: the callbacks catch
    host_url_.swap(key);
    host_of_url_.swap(host);
  }
  return host_of_url_;
}

void HttpEngine::set_allowlist(const Allowlist& allow) {
  try {
    options_.allow = allow;
  } catch (...) {
    options_.allow = Allowlist{};  // out of memory: the narrowest list
  }
}

HttpEngine::HttpEngine(const HttpEngineOptions& options) : options_(options) {
  try {
    if (options_.max_total < 1) options_.max_total = 1;
    if (options_.connect_timeout_ms < 1) options_.connect_timeout_ms = 1;
    if (options_.user_agent.empty()) options_.user_agent = std::string("relaybus/") + kVersion;
    if (!curl_global_ready()) return;
    SignalGuard guard;
    CURLM* m = curl_multi_init();
    if (m == nullptr) return;
    curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, &HttpEngineCallbacks::socket_cb);
    curl_multi_setopt(m, CURLMOPT_SOCKETDATA, this);
    // Idle connections kept for reuse. libcurl's default (4 per added handle)
    // shrinks as transfers finish and would close most of a burst's connections.
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, static_cast<long>(options_.max_total));
    curl_multi_setopt(m, CURLMOPT_PIPELINING, static_cast<long>(CURLPIPE_MULTIPLEX));
    multi_ = m;
#ifdef __linux__
    ready_fd_ = epoll_create1(EPOLL_CLOEXEC);
#endif
  } catch (...) {
  }
}

HttpEngine::~HttpEngine() {
  cancel_all();
  for (void* e : idle_easy_) curl_easy_cleanup(static_cast<CURL*>(e));
  idle_easy_.clear();
  if (multi_ != nullptr) {
    SignalGuard guard;
    curl_multi_cleanup(static_cast<CURLM*>(multi_));
  }
  if (ready_fd_ >= 0) close(ready_fd_);
}

void HttpEngine::socket_changed(int fd, int what) {
  try {
    if (what == CURL_POLL_REMOVE || what == CURL_POLL_NONE) {
      if (sockets_.erase(fd) > 0) {
        ++sockets_generation_;
        watch(fd, nullptr);
      }
      return;
    }
    const SocketWant want{fd, what == CURL_POLL_IN || what == CURL_POLL_INOUT,
                          what == CURL_POLL_OUT || what == CURL_POLL_INOUT};
    auto it = sockets_.find(fd);
    if (it != sockets_.end() && it->second.read == want.read && it->second.write == want.write) return;
    sockets_[fd] = want;
    ++sockets_generation_;
    watch(fd, &want);
  } catch (...) {
  }
}

void HttpEngine::watch(int fd, const SocketWant* want) {
#ifdef __linux__
  if (ready_fd_ < 0) return;
  auto it = watched_.find(fd);
  if (want == nullptr) {
    // libcurl says so before it closes a socket (a closed one leaves the set anyway).
    if (it == watched_.end()) return;
    watched_.erase(it);
    (void)epoll_ctl(ready_fd_, EPOLL_CTL_DEL, fd, nullptr);
    return;
  }
  epoll_event ev{};
  ev.events = (want->read ? EPOLLIN : 0u) | (want->write ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  const bool known = it != watched_.end();
  int rc = epoll_ctl(ready_fd_, known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
  if (rc != 0 && errno == (known ? ENOENT : EEXIST))
    rc = epoll_ctl(ready_fd_, known ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
  if (rc == 0) {
    try {
      watched_[fd] = ev.events;
      return;
    } catch (...) {
    }
  }
  // Out of step (no memory for it): the caller waits on sockets() from now on.
  close(ready_fd_);
  ready_fd_ = -1;
  watched_.clear();
#else
  (void)fd;
  (void)want;
#endif
}

void HttpEngine::on_ready() {
#ifdef __linux__
  if (ready_fd_ < 0 || multi_ == nullptr) return;
  epoll_event events[64];
  const int n = epoll_wait(ready_fd_, events, 64, 0);
  if (n <= 0) return;
  Batch batch;
  for (int i = 0; i < n; i++) {
    const int fd = events[i].data.fd;
    const uint32_t e = events[i].events;
    const bool failed = (e & (EPOLLERR | EPOLLHUP)) != 0;
    on_socket(fd, failed || (e & EPOLLIN), failed || (e & EPOLLOUT));
  }
#endif
}

int HttpEngine::limit_of(int handler_key) const {
  auto it = limits_.find(handler_key);
  return it == limits_.end() ? kDefaultHandlerLimit : it->second;
}

void HttpEngine::set_handler_limit(int handler_key, int concurrency) {
  try {
    limits_[handler_key] = std::max(1, concurrency);
  } catch (...) {
  }
}

size_t HttpEngine::in_flight(int handler_key) const {
  auto it = running_.find(handler_key);
  return it == running_.end() ? 0 : static_cast<size_t>(it->second);
}

bool HttpEngine::can_submit(int handler_key) const {
  return multi_ != nullptr && transfers_.size() < static_cast<size_t>(options_.max_total) &&
         in_flight(handler_key) < static_cast<size_t>(limit_of(handler_key));
}

bool HttpEngine::submit(HttpRequest req, std::string* why) {
  try {
    if (multi_ == nullptr) {
      text::set_why(why, "the HTTP engine could not initialize libcurl");
      return false;
    }
    if (transfers_.size() >= static_cast<size_t>(options_.max_total)) {
      text::set_why(why, "too many HTTP requests in flight (" + std::to_string(options_.max_total) + ")");
      return false;
    }
    if (in_flight(req.handler_key) >= static_cast<size_t>(limit_of(req.handler_key))) {
      text::set_why(why, "handler " + std::to_string(req.handler_key) + " already has " +
                             std::to_string(limit_of(req.handler_key)) + " requests in flight");
      return false;
    }
    if (req.timeout_ms <= 0) {
      text::set_why(why, "the request timeout must be positive");
      return false;
    }
    if (!(starts_with_icase(req.url, "http://") || starts_with_icase(req.url, "https://")) ||
        req.url.find_first_of(std::string_view("\r\n\0 \t", 5)) != std::string::npos) {
      text::set_why(why, "URL " + text::quote(req.url, 100) + " is not an http(s) URL");
      return false;
    }
    if (req.url != last_valid_url_) {
      // libcurl's own parser, the one the request will go through (once per
      // URL: a handler sends every request to the same one).
      CURLU* u = curl_url();
      if (u == nullptr) throw std::bad_alloc();
      const CURLUcode uc = curl_url_set(u, CURLUPART_URL, req.url.c_str(), 0);
      curl_url_cleanup(u);
      if (uc != CURLUE_OK) {
        text::set_why(why, "URL " + text::quote(req.url, 100) + " is not valid: " + curl_url_strerror(uc));
        return false;
      }
      last_valid_url_ = req.url;
    }
    bool has_content_type = false;
    for (const auto& [name, value] : req.headers) {
      if (!valid_request_header(name, value, why)) return false;
      has_content_type = has_content_type || text::iequals(name, "content-type");
    }

    auto t = std::make_unique<Transfer>();
    t->engine = this;
    t->req = std::move(req);
    t->start = Clock::now();

    auto add_header = [&](const std::string& line) {
      curl_slist* n = curl_slist_append(t->headers, line.c_str());
      if (n == nullptr) throw std::bad_alloc();
      t->headers = n;
    };
    if (!has_content_type) add_header("content-type: application/json");
    for (const auto& [name, value] : t->req.headers) add_header(value.empty() ? name + ";" : name + ": " + value);
    add_header("Expect:");  // no 100-continue round trip for larger bodies

    // A finished request's handle if there is one: a new handle costs its
    // allocations (buffers, state), and curl_easy_reset plus setting every
    // option again cost ~7k instructions a request. A kept handle keeps the
    // options that are the engine's (below, set once); those of a request
    // are all set again here, including every pointer into its Transfer.
    CURL* e = nullptr;
    bool fresh = false;
    if (!idle_easy_.empty()) {
      e = idle_easy_.back();
      idle_easy_.pop_back();
    } else {
      e = curl_easy_init();
      fresh = true;
    }
    if (e == nullptr) {
      text::set_why(why, "libcurl could not create a request handle");
      return false;
    }
    t->easy = e;
    const HttpRequest& r = t->req;
    const long timeout = static_cast<long>(std::min<int64_t>(r.timeout_ms, LONG_MAX));
    const long connect_timeout = static_cast<long>(std::min<int64_t>(options_.connect_timeout_ms, timeout));
    bool ok = true;
    auto set = [&](CURLcode c) { ok = ok && c == CURLE_OK; };
    if (fresh) {
      // The engine's options, the same for every request it sends.
      set(curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L));
      set(curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https"));
      set(curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https"));
      set(curl_easy_setopt(e, CURLOPT_PROXY, ""));  // no proxy from the environment
      set(curl_easy_setopt(e, CURLOPT_POST, 1L));
      set(curl_easy_setopt(e, CURLOPT_USERAGENT, options_.user_agent.c_str()));
      set(curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS)));
      set(curl_easy_setopt(e, CURLOPT_DNS_CACHE_TIMEOUT, static_cast<long>(std::max(0, options_.dns_cache_timeout_s))));
#if LIBCURL_VERSION_NUM >= 0x075700  // 7.87.0
      // A name lookup runs in a thread of libcurl's resolver. Without this, a
      // request that ends (timeout, cancel, the engine's destruction) while its
      // lookup still hangs joins that thread: the whole event loop, every other
      // handler's requests and the dispatcher's exit wait for the lookup (seconds
      // per resolver try). With it the thread is detached and cleans up after itself.
      set(curl_easy_setopt(e, CURLOPT_QUICK_EXIT, 1L));
#endif
      set(curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L));
      set(curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 60L));
      set(curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 30L));
      set(curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L));
      set(curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L));
      if (!options_.ca_file.empty()) set(curl_easy_setopt(e, CURLOPT_CAINFO, options_.ca_file.c_str()));
      set(curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &HttpEngineCallbacks::write_cb));
      set(curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &HttpEngineCallbacks::header_cb));
      set(curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, &HttpEngineCallbacks::opensocket_cb));
#if LIBCURL_VERSION_NUM >= 0x075000  // 7.80.0
      set(curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, &HttpEngineCallbacks::prereq_cb));
#endif
    }
    // The request's own options.
    set(curl_easy_setopt(e, CURLOPT_PRIVATE, t.get()));
    set(curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf));
    set(curl_easy_setopt(e, CURLOPT_URL, r.url.c_str()));
    set(curl_easy_setopt(e, CURLOPT_POSTFIELDS, r.body.data()));
    set(curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size())));
    set(curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers));
    set(curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout));
    set(curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout));
    // Over TLS, wait for the first connection's ALPN answer (known after its
    // handshake) rather than opening one connection per request of a burst to
    // an HTTP/2 server. Not for http://: there libcurl would only learn that
    // the connection cannot multiplex from its first response, serializing a
    // burst behind it.
    set(curl_easy_setopt(e, CURLOPT_PIPEWAIT, starts_with_icase(r.url, "https://") ? 1L : 0L));
    // prereq_cb may have forbidden reuse for the handle's previous request.
    set(curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 0L));
    if (r.follow_redirects) {
      set(curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L));
      set(curl_easy_setopt(e, CURLOPT_MAXREDIRS, kMaxRedirects));
      // Keep POSTing (with the body) after 301/302/303 too.
      set(curl_easy_setopt(e, CURLOPT_POSTREDIR, static_cast<long>(CURL_REDIR_POST_ALL)));
    } else {
      set(curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L));
    }
    set(curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get()));
    set(curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get()));
    set(curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, t.get()));
#if LIBCURL_VERSION_NUM >= 0x075000  // 7.80.0
    set(curl_easy_setopt(e, CURLOPT_PREREQDATA, t.get()));
#endif
    if (!ok) {
      text::set_why(why, "libcurl rejected an option of the request (is libcurl older than 7.85?)");
      return false;
    }

    Transfer* raw = t.get();
    transfers_.emplace(raw, std::move(t));  // may throw: nothing added to curl yet
    CURLMcode mc;
    {
      SignalGuard guard;
      mc = curl_multi_add_handle(static_cast<CURLM*>(multi_), e);
    }
    if (mc != CURLM_OK) {
      transfers_.erase(raw);
      text::set_why(why, std::string("libcurl could not start the request: ") + curl_multi_strerror(mc));
      return false;
    }
    ++running_[raw->req.handler_key];
    return true;
  } catch (const std::exception& ex) {
    text::set_why(why, std::string("could not start the request: ") + ex.what());
    return false;
  } catch (...) {
    text::set_why(why, "could not start the request");
    return false;
  }
}

std::vector<HttpEngine::SocketWant> HttpEngine::sockets() const {
  std::vector<SocketWant> out;
  try {
    out.reserve(sockets_.size());
    for (const auto& kv : sockets_) out.push_back(kv.second);
  } catch (...) {
  }
  return out;
}

int64_t HttpEngine::timeout_ms() const {
  if (multi_ == nullptr) return -1;
  long ms = -1;
  if (curl_multi_timeout(static_cast<CURLM*>(multi_), &ms) != CURLM_OK) return 0;
  return ms < 0 ? -1 : static_cast<int64_t>(ms);
}

void HttpEngine::on_socket(int fd, bool readable, bool writable) {
  if (multi_ == nullptr || sockets_.find(fd) == sockets_.end()) return;
  int mask = (readable ? CURL_CSELECT_IN : 0) | (writable ? CURL_CSELECT_OUT : 0);
  int running = 0;
  {
    SignalGuard guard;
    curl_multi_socket_action(static_cast<CURLM*>(multi_), fd, mask, &running);
  }
  finish_done_transfers();
}

void HttpEngine::on_timeout() {
  if (multi_ == nullptr) return;
  int running = 0;
  {
    SignalGuard guard;
    curl_multi_socket_action(static_cast<CURLM*>(multi_), CURL_SOCKET_TIMEOUT, 0, &running);
  }
  finish_done_transfers();
}

namespace {

void classify_status(HttpResult* r, bool following) {
  const int s = r->status;
  if (s >= 200 && s <= 299) {
    r->outcome = HttpOutcome::Success;
    r->error.clear();
    return;
  }
  r->error = "HTTP " + std::to_string(s);
  if (s == 408 || s == 429 || (s >= 500 && s <= 599)) {
    r->outcome = HttpOutcome::Retry;
  } else {
    r->outcome = HttpOutcome::Fail;
    if (s >= 300 && s <= 399 && !following) r->error += " (redirects are not followed)";
  }
}

}  // namespace

void HttpEngine::finish_done_transfers() {
  CURLM* m = static_cast<CURLM*>(multi_);
  CURLMsg* msg;
  int queued = 0;
  while ((msg = curl_multi_info_read(m, &queued)) != nullptr) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* e = msg->easy_handle;
    const CURLcode rc = msg->data.result;
    Transfer* t = nullptr;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
    if (t == nullptr || transfers_.find(t) == transfers_.end()) {
      SignalGuard guard;
      curl_multi_remove_handle(m, e);
      continue;
    }
    try {
      HttpResult r;
      r.tag = t->req.tag;
      r.handler_key = t->req.handler_key;
      r.elapsed_ms = ms_since(t->start);
      long status = 0;
      curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
      r.status = static_cast<int>(status);
      long version = 0;
      curl_easy_getinfo(e, CURLINFO_HTTP_VERSION, &version);
      switch (version) {
        case CURL_HTTP_VERSION_1_0:
          r.http_version = 10;
          break;
        case CURL_HTTP_VERSION_1_1:
          r.http_version = 11;
          break;
        case CURL_HTTP_VERSION_2_0:
          r.http_version = 20;
          break;
        case CURL_HTTP_VERSION_3:
          r.http_version = 30;
          break;
        default:
          r.http_version = 0;
      }
      if (r.status == 0) r.http_version = 0;
      long connects = 0;
      curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &connects);
      r.new_connections = static_cast<int>(connects);
      r.response_bytes = t->response_bytes;
      r.body = std::move(t->body);
      long os_errno = 0;
      curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &os_errno);
      const std::string detail = t->errbuf[0] != '\0' ? t->errbuf : curl_easy_strerror(rc);

      if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t->cut_off && r.status > 0)) {
        classify_status(&r, t->req.follow_redirects);
        if ((r.status == 429 || r.status == 503) && !t->retry_after.empty())
          r.retry_after_ms =
              clamp_retry_after_ms(retry_after_ms(t->retry_after, now_epoch_ms()), t->req.max_retry_after_ms);
      } else {
        r.outcome = HttpOutcome::Retry;
        r.status = 0;  // no complete HTTP response
        r.http_version = 0;
        switch (rc) {
          case CURLE_OPERATION_TIMEDOUT: {
            // A reused connection has no connect time (0) either, but it got
            // as far as sending the request (a pretransfer time).
            curl_off_t connect_us = 0, pretransfer_us = 0;
            curl_easy_getinfo(e, CURLINFO_CONNECT_TIME_T, &connect_us);
            curl_easy_getinfo(e, CURLINFO_PRETRANSFER_TIME_T, &pretransfer_us);
            const bool connecting = connect_us == 0 && pretransfer_us == 0;
            const int64_t connect_limit = std::min(options_.connect_timeout_ms, t->req.timeout_ms);
            // libcurl's text for a lookup that did not finish in time.
            const bool resolving = connecting && starts_with_icase(detail, "resolving timed out");
            if (connecting && connect_limit < t->req.timeout_ms)
              r.error = "connect timeout after " + std::to_string(connect_limit) + " ms";
            else
              r.error = "timeout after " + std::to_string(t->req.timeout_ms) + " ms";
            if (resolving)
              r.error += " (while resolving the host name)";
            else if (connecting && connect_limit >= t->req.timeout_ms)
              r.error += " (while connecting)";
            break;
          }
          case CURLE_COULDNT_CONNECT:
            if (t->hop_refused > 0 && t->hop_opened == 0) {
              r.outcome = HttpOutcome::Fail;  // the policy, not the network: retrying won't help
              r.error = t->refusal;
            } else {
              r.error = errno_text(os_errno);
              if (r.error.empty()) r.error = "could not connect: " + detail;
            }
            break;
          case CURLE_COULDNT_RESOLVE_HOST:
            r.error = "could not resolve host: " + detail;
            break;
          case CURLE_GOT_NOTHING:
            r.error = "connection closed without a response";
            break;
          case CURLE_SEND_ERROR:
          case CURLE_RECV_ERROR:
            r.error = errno_text(os_errno);
            if (r.error.empty())
              r.error = std::string(rc == CURLE_SEND_ERROR ? "send failed: " : "receive failed: ") + detail;
            break;
          case CURLE_PARTIAL_FILE:
            r.error = "response cut short: " + detail;
            break;
          case CURLE_ABORTED_BY_CALLBACK:
            if (t->gate_refused) {
              r.unsent = true;
              r.error = "not sent: the send gate refused it";
            } else if (t->reuse_refused) {
              r.outcome = HttpOutcome::Fail;  // the policy, as for a refused new connection
              r.error = t->refusal;
            } else {
              r.error = detail;
            }
            break;
          case CURLE_TOO_MANY_REDIRECTS:
            r.outcome = HttpOutcome::Fail;
            r.error = "too many redirects (more than " + std::to_string(kMaxRedirects) + ")";
            break;
          case CURLE_UNSUPPORTED_PROTOCOL:
          case CURLE_URL_MALFORMAT:
            r.outcome = HttpOutcome::Fail;
            r.error = detail;
            break;
          case CURLE_PEER_FAILED_VERIFICATION:
          case CURLE_SSL_CONNECT_ERROR:
          case CURLE_SSL_CERTPROBLEM:
          case CURLE_SSL_CIPHER:
          case CURLE_SSL_CACERT_BADFILE:
          case CURLE_SSL_ISSUER_ERROR:
          case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
          case CURLE_SSL_INVALIDCERTSTATUS:
          case CURLE_SSL_CRL_BADFILE:
            r.error = "TLS: " + detail;
            break;
          default:
            r.error = detail;
        }
      }
      results_.push_back(std::move(r));
    } catch (...) {
      try {
        HttpResult r;
        r.tag = t->req.tag;
        r.handler_key = t->req.handler_key;
        r.outcome = HttpOutcome::Retry;
        r.error = "out of memory";
        results_.push_back(std::move(r));
      } catch (...) {
      }
    }
    remove_transfer(t);
  }
}

void HttpEngine::remove_transfer(Transfer* t) {
  auto it = transfers_.find(t);
  if (it == transfers_.end()) return;
  auto r = running_.find(t->req.handler_key);
  if (r != running_.end() && --r->second <= 0) running_.erase(r);
  SignalGuard guard;
  curl_multi_remove_handle(static_cast<CURLM*>(multi_), t->easy);
  // Keep the handle for the next request (with the engine's options; submit
  // sets the request's again; its connection stays in the multi handle's
  // cache either way).
  if (t->easy != nullptr && idle_easy_.size() < static_cast<size_t>(options_.max_total)) {
    try {
      idle_easy_.reserve(static_cast<size_t>(options_.max_total));
      idle_easy_.push_back(t->easy);
      t->easy = nullptr;
    } catch (...) {
    }
  }
  transfers_.erase(it);  // ~Transfer cleans up a handle not kept
}

struct HttpEngine::Batch::Guard {
  SignalGuard guard;
};

HttpEngine::Batch::Batch() {
  try {
    guard_ = new Guard();
  } catch (...) {
    guard_ = nullptr;  // then every call guards itself
  }
}

HttpEngine::Batch::~Batch() { delete guard_; }

std::vector<HttpResult> HttpEngine::take_results() {
  std::vector<HttpResult> out;
  out.swap(results_);
  return out;
}

void HttpEngine::cancel_all() {
  while (!transfers_.empty()) remove_transfer(transfers_.begin()->first);
  running_.clear();
}

}  // namespace relaybus::core
