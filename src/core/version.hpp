#pragma once

namespace relaybus::core {

// Bumped together with the extension's default_version in relaybus.control.
constexpr const char* kVersion = "0.1.0";

}  // namespace relaybus::core
