// The one record an error crosses the C++/PostgreSQL boundary in, either way,
// in plain memory: neither a C++ exception nor a longjmp ever crosses it.
// Plain (no PostgreSQL header, no STL container): glue and C++ files both
// include it.
#pragma once

#include <cstddef>
#include <cstring>

namespace relaybus::pg {

constexpr size_t kErrLen = 512;

// A SQLSTATE packed as PostgreSQL's MAKE_SQLSTATE packs it (so C++ files name
// one without PostgreSQL's headers; boundary.cpp checks the packing).
constexpr int sqlstate(const char (&code)[6]) {
  int packed = 0;
  for (int i = 0; i < 5; i++) packed += ((code[i] - '0') & 0x3F) << (6 * i);
  return packed;
}

namespace sqlstates {
constexpr int kInvalidParameterValue = sqlstate("22023");
constexpr int kOutOfMemory = sqlstate("53200");
constexpr int kInternalError = sqlstate("XX000");
}  // namespace sqlstates

struct ErrorRecord {
  // A PostgreSQL ERROR's copied ErrorData (CopyErrorData, in the memory
  // context current at the call), raised again unchanged; nullptr for an error
  // of C++ code.
  void* pg_error;
  int sqlstate;
  char message[kErrLen];
  char detail[kErrLen];
  char hint[kErrLen];
};

// Copies a text into a record's field, cut to fit (nullptr: "").
inline void copy_error_text(char (&to)[kErrLen], const char* from) noexcept {
  std::strncpy(to, from != nullptr ? from : "", kErrLen - 1);
  to[kErrLen - 1] = '\0';
}

// A palloc'd copy of s in the memory context current at the call (glue).
bool pg_strdup(const char* s, char** out, ErrorRecord* err) noexcept;

// relaybus.test_fault (test only): makes relay._validate_route fail each way
// the boundary must handle (raise_test_fault, cpp/invoke.hpp).
// The setting's value, "" when off (glue, boundary.cpp).
const char* test_fault_setting() noexcept;
// Raises a PostgreSQL ERROR (division by zero) under pg_catch (glue).
bool test_fault_pg_error(ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
