#include "pg/cpp/invoke.hpp"

#include <cstring>
#include <new>
#include <stdexcept>

namespace relaybus::pg {

void record_exception(ErrorRecord* out) noexcept {
  out->pg_error = nullptr;
  out->sqlstate = sqlstates::kInternalError;
  out->detail[0] = '\0';
  out->hint[0] = '\0';
  try {
    throw;
  } catch (const PgError& e) {
    *out = e.record();
  } catch (const SqlError& e) {
    out->sqlstate = e.sqlstate();
    copy_error_text(out->message, e.what());
    copy_error_text(out->detail, e.detail().c_str());
    copy_error_text(out->hint, e.hint().c_str());
  } catch (const std::bad_alloc&) {
    out->sqlstate = sqlstates::kOutOfMemory;
    copy_error_text(out->message, "out of memory in relaybus");
  } catch (const std::exception& e) {
    copy_error_text(out->message, e.what());
  } catch (...) {
    copy_error_text(out->message, "unknown C++ exception in relaybus");
  }
}

void raise_test_fault() {
  const char* fault = test_fault_setting();
  if (fault[0] == '\0') return;
  // Unwinding must destroy it, whichever way the error leaves.
  std::string alive = std::string("relaybus.test_fault = ") + fault;
  if (std::strcmp(fault, "bad_alloc") == 0) throw std::bad_alloc();
  if (std::strcmp(fault, "exception") == 0) throw std::runtime_error(alive);
  if (std::strcmp(fault, "pg_error") == 0) pg_call([](ErrorRecord* err) { return test_fault_pg_error(err); });
}

}  // namespace relaybus::pg
