#pragma once

// Prometheus text exposition (format 0.0.4) helpers for the processes beside
// the server.

#include <string>
#include <string_view>

namespace relaybus::core {

// A label value as it goes between the quotes: '\' and '"' escaped, a newline
// as \n.
std::string prometheus_label(std::string_view value);

}  // namespace relaybus::core
