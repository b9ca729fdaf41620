// The C++ side of the C++/PostgreSQL boundary (C++ files only: no PostgreSQL
// header). Both directions, each through one wrapper:
//
//  - PostgreSQL -> C++: glue calls C++ only through noexcept functions whose
//    body runs under invoke_cpp(): every exception is caught into an
//    ErrorRecord after all C++ objects of the body are destroyed, and the glue
//    raises the record as an ERROR (boundary.hpp's raise_error).
//  - C++ -> PostgreSQL: C++ calls PostgreSQL only through glue functions that
//    catch an ERROR into an ErrorRecord (boundary.hpp's pg_catch) and return
//    false; pg_call() turns that into a PgError, which unwinds the C++ frames
//    and is raised again unchanged at the boundary.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "pg/cpp/boundary.h"

namespace relaybus::pg {

// A PostgreSQL ERROR raised under C++ frames, carried to the boundary. After
// one, C++ code only unwinds: it calls PostgreSQL again only once the error is
// raised again or the transaction is aborted.
class PgError final : public std::exception {
 public:
  explicit PgError(const ErrorRecord& record) noexcept : record_(record) {}
  const ErrorRecord& record() const noexcept { return record_; }
  const char* what() const noexcept override { return record_.message; }

 private:
  ErrorRecord record_;
};

// An error C++ code raises for the SQL caller: a SQLSTATE (sqlstate("22023"),
// sqlstates::...) and texts.
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

// Called inside a catch block: records the exception being handled (a
// PgError's PostgreSQL error; a SqlError's SQLSTATE and texts; 53200 for
// std::bad_alloc; XX000 with the message for anything else).
void record_exception(ErrorRecord* out) noexcept;

// Runs f (C++, may throw). Returns false with *err filled when an exception
// left it; by then every object of f is destroyed.
template <typename F>
bool invoke_cpp(ErrorRecord* err, F&& f) noexcept {
  try {
    f();
    return true;
  } catch (...) {
    record_exception(err);
  }
  return false;
}

// Calls a glue function `bool g(..., ErrorRecord*)` (through f, given the
// record): its PostgreSQL ERROR becomes a PgError.
template <typename F>
void pg_call(F&& f) {
  ErrorRecord err;
  if (!f(&err)) throw PgError(err);
}

}  // namespace relaybus::pg

namespace relaybus::pg {

// relaybus.test_fault (test only): throws what it names (std::bad_alloc, a
// std::exception, or a PostgreSQL ERROR through pg_call), so that tests see
// each become a clean ERROR with its SQLSTATE.
void raise_test_fault();

}  // namespace relaybus::pg
