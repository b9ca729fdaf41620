#include "pg/cpp/topic_check.h"

#include <string>
#include <string_view>

#include "core/topic.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

bool check_topic(const char* topic, int len, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    std::string why;
    std::string_view t(topic, len);
    if (!core::is_valid_topic(t, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid topic \"" + std::string(t) + "\"",
                     why.empty() ? "invalid value" : why,
                     "A topic is dot-separated segments of letters, digits, '_' and '-', such as order.created.");
  });
}

}  // namespace relaybus::pg
