// The core's topic rule for glue (C++, cpp/topic_check.cpp).
#pragma once

#include "pg/cpp/boundary.h"

namespace relaybus::pg {

// False with *err filled (22023, "invalid topic", the reason and a hint) if
// topic[0..len) is not a valid topic.
bool check_topic(const char* topic, int len, ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
