// The C++/PostgreSQL boundary.
//
// PostgreSQL reports errors with longjmp, which skips C++ destructors, and C++
// exceptions must never unwind through PostgreSQL frames. So relaybus keeps the
// two worlds apart: glue code that calls PostgreSQL holds no C++ objects with
// destructors, and calls into the core go through run_core(), which catches every
// exception and hands back a plain C string after all C++ objects are destroyed.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <string>

namespace relaybus::pg {

constexpr size_t kErrLen = 512;

// Runs f (pure C++, no PostgreSQL calls). f returns true on success or false
// after filling *why. On failure or exception the message is copied into err.
template <typename F>
bool run_core(F&& f, char (&err)[kErrLen]) noexcept {
  err[0] = '\0';
  bool ok = false;
  try {
    std::string why;
    ok = f(&why);
    if (!ok) {
      std::strncpy(err, why.empty() ? "invalid value" : why.c_str(), kErrLen - 1);
      err[kErrLen - 1] = '\0';
    }
  } catch (const std::bad_alloc&) {
    std::strncpy(err, "out of memory in relaybus core", kErrLen - 1);
    ok = false;
  } catch (const std::exception& e) {
    std::strncpy(err, e.what(), kErrLen - 1);
    err[kErrLen - 1] = '\0';
    ok = false;
  } catch (...) {
    std::strncpy(err, "unknown C++ exception in relaybus core", kErrLen - 1);
    ok = false;
  }
  return ok;
}

}  // namespace relaybus::pg
