#pragma once

namespace relaybus::core {

// The extension's default_version in relaybus.control (test/core/version_test.cpp).
constexpr const char* kVersion = "0.6.0";

}  // namespace relaybus::core
