// The glue side of the C++/PostgreSQL boundary (glue files only: no STL
// container). PostgreSQL raises an ERROR with longjmp, which skips C++
// destructors, and a C++ exception must never unwind through PostgreSQL's (C)
// frames; so an error crosses only as an ErrorRecord (cpp/boundary.h), through
// one wrapper per direction (the C++ side is cpp/invoke.hpp):
//
//  - PostgreSQL -> C++: glue calls a noexcept C++ function that reports
//    failure in a record, and raises it with raise_error(): a PostgreSQL
//    error again unchanged (SQLSTATE, detail, hint, context), else an ERROR
//    with the record's SQLSTATE and texts.
//  - C++ -> PostgreSQL: a glue function called from C++ runs its PostgreSQL
//    calls under pg_catch(), which catches an ERROR (PG_TRY, CopyErrorData,
//    FlushErrorState) into the record and returns false.
//
// worker_step() is no crossing: it is a background worker's own recovery from
// an ERROR, in glue.
#pragma once

#include "pg/cpp/boundary.h"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// Raises what a record holds as a PostgreSQL ERROR.
[[noreturn]] void raise_error(const ErrorRecord* err);

// The same, but an error of C++ code says first what failed ("what: message").
[[noreturn]] void raise_error_in(const char* what, const ErrorRecord* err);

// Fills *err from a copied PostgreSQL error (pg_catch's catch block).
void record_pg_error(ErrorRecord* err, ErrorData* error);

// Runs f (glue: PostgreSQL calls, no C++ object with a destructor). Returns
// false with *err filled if it raised an ERROR, copied into the memory context
// current at the call.
template <typename F>
bool pg_catch(ErrorRecord* err, F&& f) {
  MemoryContext cxt = CurrentMemoryContext;
  volatile bool ok = true;
  PG_TRY();
  { f(); }
  PG_CATCH();
  {
    MemoryContextSwitchTo(cxt);
    ErrorData* error = CopyErrorData();
    FlushErrorState();
    record_pg_error(err, error);
    ok = false;
  }
  PG_END_TRY();
  return ok;
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

// Defines relaybus.test_fault (test only; cpp/boundary.h).
void define_boundary_settings();

}  // namespace relaybus::pg
