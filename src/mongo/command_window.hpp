// What the dispatcher's loop must not leave waiting while one of its store
// commands runs (FerretDB: up to seconds each on a loaded machine):
//  - the HTTP requests in flight: a helper thread drives the engine's sockets
//    and timers, so requests go out, responses are read and timeouts fire on
//    time; their results wait in the engine for the loop;
//  - the lane leases: another helper thread renews them when they fall due,
//    over a store connection of its own (one insertMany into relay_lanes).
// The window opens when a command starts and closes when it ends (the store's
// CommandObserver). Outside a window both threads are parked and the loop
// alone touches the engine and its lease state; inside one the loop is busy in
// the store, which touches neither. These exclusive phases replace a lock
// around either. Renewal results are handed back when the window closes and
// the loop applies them (Dispatcher::apply_renewals).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mongo/store.hpp"

namespace relaybus::core {
class HttpEngine;
}

namespace relaybus::mongo {

class CommandWindow {
 public:
  // lease_store: the renewals' own connection (used by the renewal thread only).
  CommandWindow(std::unique_ptr<Store> lease_store, int64_t lease_ms);
  ~CommandWindow();  // joins both threads
  CommandWindow(const CommandWindow&) = delete;
  CommandWindow& operator=(const CommandWindow&) = delete;

  // A lease this instance holds, as the loop knows it.
  struct Lease {
    int lane = 0;
    int64_t epoch = 0;
    int64_t until_ms = 0;
  };
  // Opens the window (loop thread): engine may be null; leases: what to renew
  // at due_ms (wall clock) if the command is still running then, and again a
  // renewal interval later; empty or with renew=false: no renewal.
  void open(core::HttpEngine* engine, std::vector<Lease> leases, const std::string& owner, int64_t due_ms,
            int64_t interval_ms, bool renew);
  // Closes it (loop thread): returns once both threads are parked again (a
  // renewal being sent is waited for).
  void close() noexcept;

  // What the renewals of the last window did, lane by lane.
  struct Renewed {
    std::map<int, int64_t> epoch;                // lane -> epoch now held
    std::map<int, std::vector<int64_t>> passed;  // lane -> epochs inserted and then renewed past
    std::set<int> lost;                          // a renewal found the next epoch taken, or came too late
    std::set<int> late;                          // of those, the ones that came too late
    int64_t until_ms = 0;                        // of the last successful renewal
    int64_t sent_ms = 0;                         // when that renewal was sent (its until minus the lease)
    std::string error;                           // a renewal that failed (the store): nothing learned
  };
  // The renewals since the last take (loop thread, outside a window).
  Renewed take_renewed();
  bool renewed_any() const { return renewed_.until_ms > 0 || !renewed_.lost.empty() || !renewed_.error.empty(); }

 private:
  void run_http();
  void run_renewals();
  void renew_once();  // renewal thread, window open, due

  std::unique_ptr<Store> lease_store_;
  const int64_t lease_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  bool quit_ = false;
  uint64_t generation_ = 0;  // windows opened; a thread works in one at most once
  bool http_busy_ = false;   // the HTTP thread is in the current window
  bool renew_busy_ = false;  // the renewal thread is sending
  int wake_fd_ = -1;         // eventfd: the window closed (the HTTP thread's poll)
  // The current window's terms (written by open, read by the threads).
  core::HttpEngine* engine_ = nullptr;
  std::vector<Lease> leases_;
  std::string owner_;
  int64_t due_ms_ = 0;
  int64_t interval_ms_ = 0;
  bool renew_ = false;
  Renewed renewed_;  // accumulated by the renewal thread, under mu_
  std::thread http_;
  std::thread renewals_;
};

}  // namespace relaybus::mongo
