#pragma once

// The reference event loop for HttpEngine: wait on the sockets and the timer
// the engine reports, then tell it what happened. The dispatcher does the
// same with a WaitEventSet (sockets as WL_SOCKET_READABLE/WRITEABLE, the
// timer as the wait's timeout, plus its latch):
//
//   for (;;) {
//     if (engine.sockets_generation() changed) rebuild the wait set from engine.sockets();
//     timeout = min(engine.timeout_ms() (-1 = none), own timers);
//     n = WaitEventSetWait(set, timeout, events, ...);
//     for each socket event: engine.on_socket(fd, readable, writable)
//                            (a socket that errored or hung up: readable and writable);
//     if (engine.timeout_ms() == 0) engine.on_timeout();
//     for (HttpResult& r : engine.take_results()) ...;
//     while (work waits && engine.can_submit(handler)) engine.submit(...);
//   }

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <vector>

#include "core/http_engine.hpp"

namespace relaybus::testing {

// One turn: waits at most max_wait_ms for what the engine wants, reports back.
inline void http_loop_turn(core::HttpEngine& engine, int64_t max_wait_ms) {
  const std::vector<core::HttpEngine::SocketWant> want = engine.sockets();
  std::vector<pollfd> pfds;
  pfds.reserve(want.size());
  for (const auto& w : want)
    pfds.push_back({w.fd, static_cast<short>((w.read ? POLLIN : 0) | (w.write ? POLLOUT : 0)), 0});
  const int64_t t = engine.timeout_ms();
  const int64_t wait = t < 0 ? max_wait_ms : std::min(t, max_wait_ms);
  const int n = poll(pfds.data(), pfds.size(), static_cast<int>(wait));
  if (n > 0) {
    for (const pollfd& p : pfds) {
      if (p.revents == 0 || (p.revents & POLLNVAL)) continue;
      const bool failed = (p.revents & (POLLERR | POLLHUP)) != 0;
      engine.on_socket(p.fd, failed || (p.revents & POLLIN), failed || (p.revents & POLLOUT));
    }
  }
  if (engine.timeout_ms() == 0) engine.on_timeout();
}

// The same turn through the engine's ready_fd alone (the dispatcher's wait
// set holds it instead of the sockets): one fd, however many sockets.
inline void http_loop_turn_ready(core::HttpEngine& engine, int64_t max_wait_ms) {
  pollfd p{engine.ready_fd(), POLLIN, 0};
  const int64_t t = engine.timeout_ms();
  const int64_t wait = t < 0 ? max_wait_ms : std::min(t, max_wait_ms);
  if (poll(&p, 1, static_cast<int>(wait)) > 0) engine.on_ready();
  if (engine.timeout_ms() == 0) engine.on_timeout();
}

// Submits every request as soon as the engine's caps allow and drives the
// engine until all have results or max_ms passed. Results in completion order.
inline std::vector<core::HttpResult> http_loop_deliver(core::HttpEngine& engine,
                                                       std::vector<core::HttpRequest> requests, int64_t max_ms = 10000,
                                                       bool ready_fd = false) {
  std::deque<core::HttpRequest> queue(std::make_move_iterator(requests.begin()),
                                      std::make_move_iterator(requests.end()));
  std::vector<core::HttpResult> results;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_ms);
  while ((!queue.empty() || engine.in_flight() > 0) && std::chrono::steady_clock::now() < deadline) {
    while (!queue.empty() && engine.can_submit(queue.front().handler_key)) {
      std::string why;
      if (!engine.submit(std::move(queue.front()), &why)) return results;  // the test sees it short
      queue.pop_front();
    }
    if (ready_fd)
      http_loop_turn_ready(engine, 50);
    else
      http_loop_turn(engine, 50);
    for (core::HttpResult& r : engine.take_results()) results.push_back(std::move(r));
  }
  return results;
}

}  // namespace relaybus::testing
