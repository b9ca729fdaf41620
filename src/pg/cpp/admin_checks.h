// The core's checks behind relay._validate_handler and relay._validate_route
// (C++, cpp/admin_checks.cpp), called from admin.cpp's entry points. Each
// returns false with *err filled (SQLSTATE 22023 and texts for a value the
// rules refuse).
#pragma once

#include "pg/cpp/boundary.h"

namespace relaybus::pg {

// *secrets_json: the handler's secrets as a JSON array text, palloc'd in the
// memory context current at the call.
bool check_handler(const char* name, int name_len, const char* kind, int kind_len, const char* target, int target_len,
                   const char* options_text, char** secrets_json, ErrorRecord* err) noexcept;
// wire: nullptr for none.
bool check_route(const char* pattern, int pattern_len, const char* wire, int wire_len, ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
