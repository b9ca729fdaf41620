#pragma once

// What a dispatcher does after an iteration, by its outcome: the error and
// isolation policy of docs/architecture.md ("Errors are charged to their
// cause"), apart from any store so that it is tested on its own. Plain fields
// and <cstdint> only: PostgreSQL glue (src/pg) holds it in its state struct
// and calls it directly; nothing here allocates or throws.
//
//   - An environmental error (error_class.hpp), or any error with nothing in
//     flight: the leases go back, and the iteration runs again after an
//     exponential backoff (kEnvironmentBackoff by consecutive failures); no
//     delivery's attempts change.
//   - Any other error with deliveries in flight: they become suspects. The
//     leases go back, and the next iterations hand over one delivery in total,
//     the handlers taking turns, until one fails alone (it is nacked, and
//     batches resume) or as many as were in flight went through alone.

#include <cstdint>

#include "core/backoff.hpp"
#include "core/error_class.hpp"

namespace relaybus::core {

// 100 ms doubling up to 5 s: short enough that a lock timeout costs little,
// long enough that a server in recovery is not hammered.
constexpr BackoffPolicy kEnvironmentBackoff = {100, 5000};

enum class AfterError {
  Backoff,     // give the in-flight leases back; wait for retry_at_ms
  Isolate,     // give them back; hand over one delivery at a time from now on
  NackPoison,  // the one delivery in flight failed alone: nack it
};

class DispatchPolicy {
 public:
  // An iteration may run (an environmental error's backoff is over).
  bool may_run(int64_t now_ms) const noexcept { return now_ms >= retry_at_ms_; }
  // When the backoff ends (0 before any error): the wait ends then at the latest.
  int64_t retry_at_ms() const noexcept { return retry_at_ms_; }

  bool isolating() const noexcept { return isolation_left_ > 0; }
  // The most one handler may hand over in this iteration.
  int batch_max(int batch_size) const noexcept { return isolating() ? 1 : batch_size; }
  // The handler (an index among nserved > 0, in iteration order) to start with:
  // isolating, the one whose turn is next; else the first.
  int first_handler(int nserved) const noexcept { return isolating() ? turn_ % nserved : 0; }
  // Isolating, handler i (as above) is being tried: the next one's turn follows.
  void took_turn(int i) noexcept {
    if (isolating()) turn_ = i + 1;
  }

  // The iteration committed, having isolated (isolating() at its start) and
  // handed over `handed` deliveries. True if the next iteration should follow
  // at once (one more went through alone).
  bool after_success(bool isolated, int handed) noexcept;

  // Isolating, nothing was left to hand over (every suspect went through or
  // is no longer ready for this dispatcher): batches again, rather than
  // counting the suspects down on deliveries published later.
  void suspects_gone() noexcept { isolation_left_ = 0; }

  // The iteration failed with an error of that cause while `in_flight`
  // deliveries were leased by it, at now_ms.
  AfterError after_error(ErrorCause cause, int in_flight, int64_t now_ms) noexcept;

  int environment_failures() const noexcept { return env_failures_; }
  int isolation_left() const noexcept { return isolation_left_; }

 private:
  int isolation_left_ = 0;  // while > 0, one delivery in total per iteration
  int turn_ = 0;            // isolating: the handler whose turn is next
  int env_failures_ = 0;    // environmental errors in a row
  int64_t retry_at_ms_ = 0;
};

}  // namespace relaybus::core
