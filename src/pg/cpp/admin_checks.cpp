#include "pg/cpp/admin_checks.h"

#include <string>
#include <string_view>

#include "core/handler_config.hpp"
#include "core/topic.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

bool check_handler(const char* name_text, int name_len, const char* kind_text_in, int kind_len, const char* target_text,
                   int target_len, const char* options_text, char** secrets_json, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    std::string_view name(name_text, name_len), kind_text(kind_text_in, kind_len);
    bool target_null = target_text == nullptr;
    std::string_view target = target_null ? std::string_view() : std::string_view(target_text, target_len);
    std::string why;
    auto detail = [&why] { return why.empty() ? std::string("invalid value") : why; };
    if (!core::is_valid_handler_name(name, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid handler name \"" + std::string(name) + "\"", detail(),
                     "Use 1 to 63 lower-case letters, digits, '_', '.' or '-'.");
    core::HandlerKind kind = core::HandlerKind::Pull;
    if (!core::parse_handler_kind(kind_text, &kind, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid handler kind \"" + std::string(kind_text) + "\"", "",
                     "The kinds are notify, http, pull and kafka.");
    if (!core::validate_target(kind, target, target_null, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid target for a " + std::string(kind_text) + " handler",
                     detail());
    core::HandlerOptions parsed;
    if (!core::parse_handler_options(kind, options_text, &parsed, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid option: " + detail());
    if (!core::check_secret_strength(parsed, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid option: " + detail(), "",
                     "Use \"whsec_\" followed by the base64 of 32 random bytes (openssl rand -base64 32).");
    std::string secrets = "[";
    for (size_t i = 0; i < parsed.secrets.size(); i++) {
      if (i > 0) secrets += ",";
      secrets += "\"" + parsed.secrets[i] + "\"";  // whsec_ + base64: nothing to escape
    }
    secrets += "]";
    pg_call([&](ErrorRecord* e) { return pg_strdup(secrets.c_str(), secrets_json, e); });
  });
}

bool check_route(const char* pattern_text, int pattern_len, const char* wire_text, int wire_len,
                 ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    std::string_view pattern(pattern_text, pattern_len);
    std::string why;
    raise_test_fault();
    if (!core::is_valid_pattern(pattern, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid topic pattern \"" + std::string(pattern) + "\"",
                     why.empty() ? "invalid value" : why,
                     "Use dot-separated segments; '*' matches one segment, '#' any number.");
    std::string_view wire(wire_text != nullptr ? wire_text : "", wire_text != nullptr ? wire_len : 0);
    if (wire_text != nullptr && !core::is_valid_topic(wire, &why))
      throw SqlError(sqlstates::kInvalidParameterValue, "invalid wire name \"" + std::string(wire) + "\"",
                     why.empty() ? "invalid value" : why);
  });
}

}  // namespace relaybus::pg
