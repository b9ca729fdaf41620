#include "pg/cpp/failure_decision.h"

#include "core/webhook_delivery.hpp"
#include "pg/cpp/handler_config.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

bool decide_failure(const HandlerConfig* config, bool permanent, int attempts_now, int64_t retry_after_ms,
                    uint64_t random64, bool* dead, int64_t* retry_in_ms, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    static const core::HandlerOptions kDefaultOptions;
    const core::HandlerOptions& opts = config != nullptr ? config->options : kDefaultOptions;
    core::FailureDecision d = core::decide_failure(opts, permanent, attempts_now, retry_after_ms, random64);
    *dead = d.dead;
    *retry_in_ms = d.retry_in_ms;
  });
}

}  // namespace relaybus::pg
