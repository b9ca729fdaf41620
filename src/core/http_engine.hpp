#pragma once

// The HTTP delivery engine: POST requests over one libcurl multi handle,
// non-blocking, driven by the caller's single-threaded event loop (in the
// extension a background worker's WaitEventSet, in tests a poll() loop; see
// test/core/http_loop.hpp for the reference loop). The engine never blocks
// and never waits by itself: the caller waits on sockets() and timeout_ms()
// and reports back with on_socket() / on_timeout(); finished requests are
// collected with take_results().
//
// Every public member is noexcept in effect (exceptions are caught inside;
// submit reports failures through *why). Not thread-safe: one engine, one
// thread. libcurl's threaded resolver starts helper threads; every libcurl
// call that may start one runs with all signals blocked, so those threads
// never receive the host process's signals.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "outbound_policy.hpp"

namespace relaybus::core {

struct HttpRequest {
  uint64_t tag = 0;     // the caller's id (the delivery id)
  int handler_key = 0;  // concurrency group (the handler id)
  std::string url;      // http:// or https:// only
  // Sent besides "content-type: application/json" (a content-type given here
  // replaces that one). Names must be tokens; values without CR, LF or NUL.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  int64_t timeout_ms = 30000;     // total, > 0
  bool follow_redirects = false;  // then at most 5 hops, each hop's address checked
  // A longer Retry-After is cut to this (the handler's backoff_max); < 0: only
  // to kRetryAfterCapMs (backoff.hpp).
  int64_t max_retry_after_ms = -1;
};

enum class HttpOutcome { Success, Retry, Fail };

struct HttpResult {
  uint64_t tag = 0;
  int handler_key = 0;
  HttpOutcome outcome = HttpOutcome::Retry;
  int status = 0;  // final HTTP status; 0 = no HTTP response
  // Human text, empty on success: "HTTP 500", "timeout after 30000 ms",
  // "connection refused", "address 127.0.0.1 is not allowed (loopback) ...".
  std::string error;
  // From Retry-After on 429/503 (clamped to the request's max_retry_after_ms), else -1.
  int64_t retry_after_ms = -1;
  // The send gate refused the request just before it would have gone out
  // (outcome Retry): the receiver got nothing, no attempt was made.
  bool unsent = false;
  int64_t elapsed_ms = 0;       // submit to completion
  int http_version = 0;         // 10, 11, 20, 30; 0 = no response
  int new_connections = 0;      // connections this request had to open (0 = reused one)
  std::string body;             // first max_response_bytes bytes of the response body
  uint64_t response_bytes = 0;  // body bytes received in all (beyond the kept ones too)
  // Kafka: acknowledged although an earlier message of its key, in flight
  // with it, failed for good: it is in the partition after that gap.
  bool after_gap = false;
  // Kafka: where the acknowledged message landed; -1: none.
  int32_t kafka_partition = -1;
  int64_t kafka_offset = -1;
};

// A header the engine sends: the name an RFC 7230 token, the value without
// CR, LF or NUL; false with *why otherwise.
bool valid_request_header(const std::string& name, const std::string& value, std::string* why);

struct HttpEngineOptions {
  int max_total = 256;  // global cap of requests in flight (>= 1); also the idle-connection cache size
  int64_t connect_timeout_ms = 10000;
  size_t max_response_bytes = 65536;  // kept in HttpResult::body; the rest is read and discarded
  // A response body longer than this is cut off (its connection is closed
  // rather than drained) and the request is classified by its status.
  uint64_t max_drain_bytes = 16u << 20;
  Allowlist allow;  // outbound policy
  bool verify_tls = true;
  std::string ca_file;           // PEM bundle; empty = the system's trust store
  std::string user_agent;        // empty = "relaybus/<version>"
  int dns_cache_timeout_s = 60;  // libcurl's DNS cache; 0 = look names up every time
};

class HttpEngine {
 public:
  explicit HttpEngine(const HttpEngineOptions& options);
  ~HttpEngine();  // drops whatever is in flight, closes every connection
  HttpEngine(const HttpEngine&) = delete;
  HttpEngine& operator=(const HttpEngine&) = delete;

  // False if libcurl could not be initialized (every submit then fails).
  bool ok() const { return multi_ != nullptr; }

  // Replaces the outbound policy (a reloaded allow-list), with requests in
  // flight: it applies to every connection opened and every request started
  // from now on, on a new or a kept-alive connection (one opened under the
  // old list to an address the new one refuses is not used again).
  void set_allowlist(const Allowlist& allow);

  // Asked with a request's tag right before the request goes out, on a new
  // or a kept-alive connection (each hop): false stops it there, and its
  // result says so (unsent). A submit can precede the moment the request
  // leaves by a whole blocked loop pass; a caller whose right to send runs
  // out in time (a lease) checks it here as well as at submit. Needs libcurl
  // 7.80 (CURLOPT_PREREQFUNCTION); older ones check at submit only.
  void set_send_gate(std::function<bool(uint64_t tag)> gate) { send_gate_ = std::move(gate); }

  // Requests of one handler_key in flight at once; default 16, < 1 means 1.
  // Lowering it below what is in flight only stops new submits.
  void set_handler_limit(int handler_key, int concurrency);
  // Below the global cap and the handler's limit.
  bool can_submit(int handler_key) const;
  // Starts a request. False (with *why) if over a cap, the URL is not
  // http(s), a header is invalid, the timeout is not positive, or libcurl
  // failed; nothing is then in flight for it and no result will come.
  // Otherwise exactly one HttpResult with req.tag comes out of
  // take_results() later (unless cancel_all() drops it first).
  bool submit(HttpRequest req, std::string* why);

  // Sockets to wait on and for what. The set may change after every call of
  // submit, on_socket, on_timeout and cancel_all (a socket may be closed and
  // its number reused): rebuild the wait set when sockets_generation()
  // changed.
  struct SocketWant {
    int fd;
    bool read;
    bool write;
  };
  std::vector<SocketWant> sockets() const;
  uint64_t sockets_generation() const { return sockets_generation_; }
  // One descriptor, readable while a socket the engine watches is ready: an
  // epoll set kept in step with libcurl's socket callbacks (Linux). A caller
  // can build its own wait set once, with this in it, instead of adding every
  // socket on every wait. -1 if there is none (not Linux, or it failed): then
  // wait on sockets(). Fixed for the engine's lifetime unless it turns -1.
  int ready_fd() const { return ready_fd_; }
  // ready_fd() polled readable: serves the sockets that are ready now (as
  // on_socket would, at most 64 per call; a next wait returns at once if
  // more are).
  void on_ready();
  // -1: no timer; otherwise ms until on_timeout() is due (0 = now).
  int64_t timeout_ms() const;
  // A socket became ready. Report errors/hang-ups as readable and writable.
  // An fd the engine no longer watches is ignored.
  void on_socket(int fd, bool readable, bool writable);
  // Call when timeout_ms() has elapsed (calling it early is harmless).
  void on_timeout();

  std::vector<HttpResult> take_results();
  size_t in_flight() const { return transfers_.size(); }
  size_t in_flight(int handler_key) const;
  // Drops everything in flight without results (their connections close).
  void cancel_all();

  // While a Batch lives, the engine's calls (submit, on_socket, on_timeout...)
  // share one signal-blocking section instead of blocking and restoring the
  // signal mask around each libcurl call: a batch of socket events or submits
  // costs its system calls once. Signals stay blocked meanwhile: keep batches
  // short and call nothing but the engine inside.
  class Batch {
   public:
    Batch();
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    struct Guard;
    Guard* guard_ = nullptr;
  };

  struct Transfer;  // internal

 private:
  friend struct HttpEngineCallbacks;
  int limit_of(int handler_key) const;
  void socket_changed(int fd, int what);
  void watch(int fd, const SocketWant* want);  // ready_fd's epoll set; nullptr: removed
  void finish_done_transfers();
  void remove_transfer(Transfer* t);

  HttpEngineOptions options_;
  std::function<bool(uint64_t)> send_gate_;
  void* multi_ = nullptr;  // CURLM*
  std::unordered_map<Transfer*, std::unique_ptr<Transfer>> transfers_;
  std::unordered_map<int, int> limits_;
  std::unordered_map<int, int> running_;  // handler_key -> in flight
  std::map<int, SocketWant> sockets_;
  uint64_t sockets_generation_ = 0;
  int ready_fd_ = -1;
  std::unordered_map<int, uint32_t> watched_;  // fd -> epoll events registered in ready_fd_
  std::vector<HttpResult> results_;
  std::vector<void*> idle_easy_;  // CURL* of finished requests, reset, for reuse
  std::string last_valid_url_;    // the last URL libcurl's parser accepted
  // The host of the URL the outbound policy last checked (every request of a
  // handler goes to the same URL: parsed once, not per request).
  std::string host_of_url_, host_url_;
  const std::string& host_of(const char* url);
};

}  // namespace relaybus::core
