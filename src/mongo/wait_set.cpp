#include "mongo/wait_set.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "mongo/util.hpp"

namespace relaybus::mongo {

Signals WaitSet::wait(int64_t max_ms, core::HttpEngine* engine, MetricsServer& server, core::KafkaSink* kafka) {
  std::vector<pollfd> fds;
  fds.push_back({signal_fd_, POLLIN, 0});
  const size_t engine_from = fds.size();
  if (engine)
    for (const auto& w : engine->sockets())
      fds.push_back({w.fd, static_cast<short>((w.read ? POLLIN : 0) | (w.write ? POLLOUT : 0)), 0});
  const size_t engine_to = fds.size();
  // Pull API requests (they call the store): served here, between loop passes.
  fds.push_back({server.api_fd(), POLLIN, 0});
  const size_t kafka_at = fds.size();
  fds.push_back({kafka ? kafka->wait_fd() : -1, POLLIN, 0});
  int64_t t = max_ms;
  if (engine) {
    int64_t et = engine->timeout_ms();
    if (et >= 0) t = std::min(t, et);
  }
  // A pipelined kafka message's timeout is the sink's own (librdkafka never
  // times it out): the wait ends at its deadline and the sink is polled.
  const int64_t kafka_due = kafka ? kafka->next_deadline_in_ms() : -1;
  if (kafka_due >= 0) t = std::min(t, kafka_due + 1);
  t = std::max<int64_t>(0, t);
  int n = poll(fds.data(), fds.size(), static_cast<int>(t));
  if (n < 0 && errno != EINTR) log_warn("poll failed", {{"error", strerror(errno)}});
  Signals sig;
  if (fds[0].revents & POLLIN) {
    char buf[64];
    ssize_t k = read(signal_fd_, buf, sizeof buf);
    for (ssize_t i = 0; i < k; i++) {
      if (buf[i] == 'T') sig.stop = true;
      if (buf[i] == 'H') sig.reload = true;
    }
    // Before anything else is served: a reloaded api_token or allowlist
    // applies to the requests that arrived with the signal. What is ready
    // stays ready for the next wait.
    if (sig.stop || sig.reload) return sig;
  }
  if (engine)
    for (size_t i = engine_from; i < engine_to; i++) {
      const pollfd& p = fds[i];
      if (p.revents == 0 || (p.revents & POLLNVAL)) continue;
      const bool failed = (p.revents & (POLLERR | POLLHUP)) != 0;
      engine->on_socket(p.fd, failed || (p.revents & POLLIN), failed || (p.revents & POLLOUT));
    }
  if (fds[engine_to].revents & POLLIN) server.serve_api();
  if ((fds[kafka_at].revents & POLLIN) || (kafka && kafka_due >= 0 && kafka->next_deadline_in_ms() == 0)) kafka->poll();
  if (kafka)
    for (const std::string& line : kafka->take_log()) log_warn(line);  // librdkafka's errors and warnings
  if (engine && (engine->timeout_ms() == 0 || n == 0)) engine->on_timeout();
  return sig;
}

}  // namespace relaybus::mongo
