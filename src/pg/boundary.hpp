// The C++/PostgreSQL boundary, in both directions, as structure rather than
// discipline (the pattern of pg_duckdb's InvokeCPPFunc and PostgresFunctionGuard).
//
// PostgreSQL raises an ERROR with longjmp, which skips C++ destructors; a C++
// exception must never unwind through PostgreSQL's (C) frames. So:
//
//  - Every SQL entry point is defined with RELAYBUS_SQL_FUNCTION(name): its body
//    runs under sql_entry(), which catches any C++ exception leaving it and,
//    after every C++ object of the body is destroyed, raises it as a
//    PostgreSQL ERROR with a SQLSTATE (SqlError's own, 53200 for bad_alloc,
//    XX000 for anything else).
//  - C++ code (frames with destructors) calls PostgreSQL only through
//    pg_guard(): an ERROR raised inside is caught there (PG_TRY, CopyErrorData,
//    FlushErrorState) and thrown as PgError, which unwinds the C++ frames; at
//    the entry point sql_entry() raises the same error again, SQLSTATE, detail,
//    hint and context unchanged. After a PgError, C++ code only unwinds: it
//    calls PostgreSQL again only once the error is raised again or the
//    transaction is aborted.
//  - C++ code reports an error to the SQL caller by throwing SqlError.
//  - A background worker recovers from an ERROR in one place, worker_step(),
//    which aborts the transaction and hands the error to the caller.
//  - Pure core calls from glue code (which holds no C++ objects) may still use
//    run_core() (guard.hpp), which turns a failure into a message.
#pragma once

#include <string>
#include <type_traits>

#include "pg/guard.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// An error PostgreSQL raised under C++ frames, carried to the boundary.
class PgError final : public std::exception {
 public:
  explicit PgError(ErrorData* data) noexcept : data_(data) {}
  ErrorData* data() const noexcept { return data_; }
  const char* what() const noexcept override;

 private:
  ErrorData* data_;  // palloc'd in the memory context current at the call
};

// An error C++ code raises for the SQL caller: a SQLSTATE (ERRCODE_*) and texts.
class SqlError final : public std::exception {
 public:
  SqlError(int sqlstate, std::string message, std::string detail = {}, std::string hint = {})
      : sqlstate_(sqlstate), message_(std::move(message)), detail_(std::move(detail)), hint_(std::move(hint)) {}
  int sqlstate() const noexcept { return sqlstate_; }
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& detail() const noexcept { return detail_; }
  const std::string& hint() const noexcept { return hint_; }

 private:
  int sqlstate_;
  std::string message_, detail_, hint_;
};

// What sql_entry() caught, in plain memory: the exception object is gone
// before anything is raised.
struct CaughtError {
  ErrorData* pg_error;  // a PgError's, raised again unchanged
  int sqlstate;
  char message[kErrLen];
  char detail[kErrLen];
  char hint[kErrLen];
};

// Called inside a catch block: records the exception being handled. No
// PostgreSQL call (a longjmp out of a catch block would corrupt the C++
// runtime's state).
void catch_exception(CaughtError* out) noexcept;
// Raises what catch_exception() recorded as a PostgreSQL ERROR.
[[noreturn]] void raise_caught(const CaughtError* caught);

template <Datum (*Body)(FunctionCallInfo)>
Datum sql_entry(FunctionCallInfo fcinfo) {
  // A C++ exception that left a PG_TRY block skipped its PG_END_TRY: put
  // PostgreSQL's error stacks back as they were at the call.
  sigjmp_buf* saved_exception_stack = PG_exception_stack;
  ErrorContextCallback* saved_context_stack = error_context_stack;
  CaughtError caught;
  try {
    return Body(fcinfo);
  } catch (...) {
    catch_exception(&caught);
  }
  PG_exception_stack = saved_exception_stack;
  error_context_stack = saved_context_stack;
  raise_caught(&caught);
}

// Runs f (plain PostgreSQL glue: it must not throw) from C++ code; an ERROR
// raised inside becomes a PgError. Returns what f returns (a scalar or a
// pointer, e.g. a palloc'd copy).
template <typename F>
auto pg_guard(F&& f) -> decltype(f()) {
  using Result = decltype(f());
  if constexpr (std::is_void_v<Result>) {
    (void)pg_guard([&] {
      f();
      return 0;
    });
  } else {
    static_assert(std::is_scalar_v<Result>, "pg_guard returns a scalar or a pointer");
    MemoryContext cxt = CurrentMemoryContext;
    ErrorData* volatile error = nullptr;
    volatile Result result{};  // read only when f returned normally
    PG_TRY();
    { result = f(); }
    PG_CATCH();
    {
      MemoryContextSwitchTo(cxt);
      error = CopyErrorData();
      FlushErrorState();
    }
    PG_END_TRY();
    if (error != nullptr) throw PgError(error);
    return result;
  }
}

// One step of a worker's loop (plain glue: it must not throw): an ERROR raised
// inside is caught here, the one place a worker recovers from one: copied into
// cxt, the error state flushed, the transaction aborted. Returns the error (the
// caller reports or classifies it, then frees it), or nullptr.
template <typename F>
ErrorData* worker_step(MemoryContext cxt, F&& f) {
  ErrorData* volatile error = nullptr;
  PG_TRY();
  { f(); }
  PG_CATCH();
  {
    // As PostgreSQL's own workers recover: no interrupt while cleaning up,
    // and no LWLock left held even when no transaction was open.
    HOLD_INTERRUPTS();
    MemoryContextSwitchTo(cxt);
    error = CopyErrorData();
    FlushErrorState();
    LWLockReleaseAll();
    AbortCurrentTransaction();
    MemoryContextSwitchTo(cxt);  // the abort left TopMemoryContext current (worker_xact.hpp)
    RESUME_INTERRUPTS();
  }
  PG_END_TRY();
  return error;
}

// relaybus.test_fault (test only): raise_test_fault() throws what it names
// (std::bad_alloc, a std::exception, or a PostgreSQL ERROR through pg_guard),
// so that tests can see each become a clean ERROR with its SQLSTATE.
void define_boundary_settings();
void raise_test_fault();

}  // namespace relaybus::pg

// Defines SQL function `name` (declared with PG_FUNCTION_INFO_V1) whose body
// follows, run under sql_entry():
//     RELAYBUS_SQL_FUNCTION(relay_ack) { ...; PG_RETURN_INT64(n); }
#define RELAYBUS_SQL_FUNCTION(name)                                                                  \
  static Datum name##_body(FunctionCallInfo fcinfo);                                                 \
  extern "C" Datum name(PG_FUNCTION_ARGS) { return ::relaybus::pg::sql_entry<name##_body>(fcinfo); } \
  static Datum name##_body(PG_FUNCTION_ARGS)
