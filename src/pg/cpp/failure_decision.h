// What a failed attempt becomes, by core::decide_failure with a handler's
// options (C++, cpp/failure_decision.cpp), for settle.cpp's judge_failures.
#pragma once

#include <cstdint>

#include "pg/cpp/boundary.h"
#include "pg/cpp/catalog_cache.h"

namespace relaybus::pg {

// config nullptr: the default options (the handler is gone). *dead: dead-letter
// it, else retry in *retry_in_ms.
bool decide_failure(const HandlerConfig* config, bool permanent, int attempts_now, int64_t retry_after_ms,
                    uint64_t random64, bool* dead, int64_t* retry_in_ms, ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
