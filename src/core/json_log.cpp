#include "core/json_log.hpp"

#include "core/webhook_delivery.hpp"

namespace relaybus::core {

std::string json_log_line(int64_t unix_ms, std::string_view level, std::string_view msg, const nlohmann::json& fields) {
  nlohmann::json line = nlohmann::json::object();
  line["ts"] = format_rfc3339_ms(unix_ms);
  line["level"] = std::string(level);
  line["msg"] = std::string(msg);
  if (fields.is_object())
    for (auto& [k, v] : fields.items()) line[k] = v;
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  return text;
}

}  // namespace relaybus::core
