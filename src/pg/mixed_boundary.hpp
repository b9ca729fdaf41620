// The boundary for the files not yet split into glue and C++ (the allow-list
// of scripts/check-boundary.sh; docs/architecture.md): their SQL entry points
// and PostgreSQL calls hold C++ objects in the same frames. Built on the same
// record and the same two wrappers as the split files (boundary.hpp,
// cpp/invoke.hpp); it goes when the allow-list is empty.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>

#include "pg/boundary.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

// Runs an entry point's body (glue and C++ in one frame) under invoke_cpp's
// catch: what leaves it is raised by raise_error once every C++ object of the
// body is destroyed.
template <Datum (*Body)(FunctionCallInfo)>
Datum sql_entry(FunctionCallInfo fcinfo) {
  // A C++ exception that left a PG_TRY block skipped its PG_END_TRY: put
  // PostgreSQL's error stacks back as they were at the call.
  sigjmp_buf* saved_exception_stack = PG_exception_stack;
  ErrorContextCallback* saved_context_stack = error_context_stack;
  ErrorRecord err;
  Datum result = 0;
  if (invoke_cpp(&err, [&] { result = Body(fcinfo); })) return result;
  PG_exception_stack = saved_exception_stack;
  error_context_stack = saved_context_stack;
  raise_error(&err);
}

// Runs f (glue) from a C++ frame under pg_catch; an ERROR raised inside
// becomes a PgError. Returns what f returns (a scalar or a pointer).
template <typename F>
auto pg_guard(F&& f) -> decltype(f()) {
  using Result = decltype(f());
  if constexpr (std::is_void_v<Result>) {
    pg_call([&](ErrorRecord* err) { return pg_catch(err, f); });
  } else {
    static_assert(std::is_scalar_v<Result>, "pg_guard returns a scalar or a pointer");
    volatile Result result{};  // read only when f returned normally
    pg_call([&](ErrorRecord* err) { return pg_catch(err, [&] { result = f(); }); });
    return result;
  }
}

// Runs f (pure C++, no PostgreSQL calls). f returns true on success or false
// after filling *why. On failure or exception the message is copied into err.
template <typename F>
bool run_core(F&& f, char (&err)[kErrLen]) noexcept {
  ErrorRecord rec;
  bool ok = false;
  err[0] = '\0';
  if (!invoke_cpp(&rec, [&] {
        std::string why;
        ok = f(&why);
        if (!ok) std::strncpy(err, why.empty() ? "invalid value" : why.c_str(), kErrLen - 1);
      }))
    std::strncpy(err, rec.message, kErrLen - 1);
  err[kErrLen - 1] = '\0';
  return ok;
}

}  // namespace relaybus::pg

// Defines SQL function `name` (declared with PG_FUNCTION_INFO_V1) whose body
// follows, run under sql_entry():
//     RELAYBUS_SQL_FUNCTION(relay_ack) { ...; PG_RETURN_INT64(n); }
#define RELAYBUS_SQL_FUNCTION(name)                                                                  \
  static Datum name##_body(FunctionCallInfo fcinfo);                                                 \
  extern "C" Datum name(PG_FUNCTION_ARGS) { return ::relaybus::pg::sql_entry<name##_body>(fcinfo); } \
  static Datum name##_body(PG_FUNCTION_ARGS)
