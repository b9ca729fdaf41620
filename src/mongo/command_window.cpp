#include "mongo/command_window.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "core/http_engine.hpp"
#include "core/store_policy.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

CommandWindow::CommandWindow(std::unique_ptr<Store> lease_store, int64_t lease_ms)
    : lease_store_(std::move(lease_store)), lease_ms_(lease_ms) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // Signals go to the loop's thread only: the helpers start with them blocked.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  http_ = std::thread([this] { run_http(); });
  renewals_ = std::thread([this] { run_renewals(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

CommandWindow::~CommandWindow() {
  {
    std::lock_guard<std::mutex> g(mu_);
    quit_ = true;
    open_ = false;
  }
  cv_.notify_all();
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
  http_.join();
  renewals_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void CommandWindow::open(core::HttpEngine* engine, std::vector<Lease> leases, const std::string& owner, int64_t due_ms,
                         int64_t interval_ms, bool renew) {
  {
    std::lock_guard<std::mutex> g(mu_);
    engine_ = engine;
    leases_ = std::move(leases);
    owner_ = owner;
    due_ms_ = due_ms;
    interval_ms_ = std::max<int64_t>(100, interval_ms);
    renew_ = renew && !leases_.empty();
    open_ = true;
    generation_++;
    http_busy_ = engine != nullptr;
  }
  cv_.notify_all();
}

void CommandWindow::close() noexcept {
  std::unique_lock<std::mutex> g(mu_);
  open_ = false;
  uint64_t one = 1;
  if (http_busy_ && wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
  cv_.notify_all();
  cv_.wait(g, [this] { return !http_busy_ && !renew_busy_; });
  engine_ = nullptr;
}

CommandWindow::Renewed CommandWindow::take_renewed() {
  std::lock_guard<std::mutex> g(mu_);
  Renewed r = std::move(renewed_);
  renewed_ = Renewed{};
  return r;
}

void CommandWindow::run_http() {
  uint64_t seen = 0;
  for (;;) {
    core::HttpEngine* engine;
    {
      std::unique_lock<std::mutex> g(mu_);
      // Not open_: a window may close before this thread wakes; it still
      // owes close() its http_busy_ = false.
      cv_.wait(g, [&] { return quit_ || (generation_ != seen && http_busy_); });
      if (quit_) return;
      seen = generation_;
      engine = engine_;
    }
    // The window is open: the engine is this thread's until close() wakes it.
    // Without an epoll set (ready_fd -1: not Linux, or it failed) requests
    // wait for the loop, as they did before this thread.
    while (engine->ready_fd() >= 0) {
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {engine->ready_fd(), POLLIN, 0}};
      int64_t t = engine->timeout_ms();
      if (t < 0 || t > 1000) t = 1000;
      const int r = poll(fds, 2, static_cast<int>(t));
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof v);
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        if (!open_ || quit_) break;
      }
      if (r > 0 && fds[1].revents) engine->on_ready();
      if (engine->timeout_ms() == 0 || r == 0) engine->on_timeout();
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      http_busy_ = false;
    }
    cv_.notify_all();
  }
}

void CommandWindow::run_renewals() {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    if (quit_) return;
    if (!open_ || !renew_) {
      cv_.wait(g);
      continue;
    }
    const int64_t now = wall_ms();
    if (now < due_ms_) {
      cv_.wait_for(g, std::chrono::milliseconds(due_ms_ - now));
      continue;
    }
    renew_busy_ = true;
    g.unlock();
    renew_once();
    g.lock();
    renew_busy_ = false;
    cv_.notify_all();
  }
}

// One insertMany of every lease's next epoch (docs/mongo.md, "Lane leases"):
// what the loop's renew_leases sends, from this thread's connection.
void CommandWindow::renew_once() {
  std::vector<Lease> leases;
  std::string owner;
  {
    std::lock_guard<std::mutex> g(mu_);
    leases = leases_;
    owner = owner_;
  }
  const int64_t sent = wall_ms();
  const int64_t until = sent + lease_ms_;
  std::vector<LaneDoc> docs;
  for (const Lease& l : leases) docs.push_back({l.lane, l.epoch + 1, owner, until});
  std::vector<bool> ok;
  std::string error;
  try {
    ok = lease_store_->insert_lanes(docs);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int64_t acked = wall_ms();
  std::lock_guard<std::mutex> g(mu_);
  if (!error.empty()) {
    renewed_.error = error;
    due_ms_ = wall_ms() + 1000;  // the loop's own renewal gets its turn after the window
    return;
  }
  std::vector<Lease> kept;
  for (size_t i = 0; i < docs.size(); i++) {
    const int lane = docs[i].lane;
    // A renewal acknowledged after the lease ran out is a loss like a
    // refused one (core::renewal_keeps_tenure); its document is this
    // instance's, so the loop's next tick takes the lane again if it is free.
    if (ok[i] && core::renewal_keeps_tenure(leases[i].until_ms, lease_ms_, acked)) {
      auto prev = renewed_.epoch.find(lane);
      if (prev != renewed_.epoch.end()) renewed_.passed[lane].push_back(prev->second);
      renewed_.epoch[lane] = docs[i].epoch;
      kept.push_back({lane, docs[i].epoch, until});
    } else {
      if (ok[i]) renewed_.late.insert(lane);
      renewed_.lost.insert(lane);
      renewed_.epoch.erase(lane);
    }
  }
  renewed_.until_ms = until;
  renewed_.sent_ms = sent;
  leases_ = std::move(kept);
  due_ms_ = sent + interval_ms_;
  if (leases_.empty()) renew_ = false;
}

}  // namespace relaybus::mongo
