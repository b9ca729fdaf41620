#include "pg/boundary.hpp"

#include <cstring>
#include <new>
#include <stdexcept>

extern "C" {
#include "utils/fmgrprotos.h"
}

namespace relaybus::pg {

const char* PgError::what() const noexcept {
  return data_ != nullptr && data_->message != nullptr ? data_->message : "PostgreSQL error";
}

static void copy_text(char (&to)[kErrLen], const char* from) noexcept {
  std::strncpy(to, from != nullptr ? from : "", kErrLen - 1);
  to[kErrLen - 1] = '\0';
}

void catch_exception(CaughtError* out) noexcept {
  out->pg_error = nullptr;
  out->sqlstate = ERRCODE_INTERNAL_ERROR;
  out->detail[0] = '\0';
  out->hint[0] = '\0';
  try {
    throw;
  } catch (const PgError& e) {
    out->pg_error = e.data();
    copy_text(out->message, e.what());
  } catch (const SqlError& e) {
    out->sqlstate = e.sqlstate();
    copy_text(out->message, e.what());
    copy_text(out->detail, e.detail().c_str());
    copy_text(out->hint, e.hint().c_str());
  } catch (const std::bad_alloc&) {
    out->sqlstate = ERRCODE_OUT_OF_MEMORY;
    copy_text(out->message, "out of memory in relaybus");
  } catch (const std::exception& e) {
    copy_text(out->message, e.what());
  } catch (...) {
    copy_text(out->message, "unknown C++ exception in relaybus");
  }
}

void raise_caught(const CaughtError* caught) {
  if (caught->pg_error != nullptr) ReThrowError(caught->pg_error);
  ereport(ERROR, (errcode(caught->sqlstate), errmsg("%s", caught->message),
                  caught->detail[0] != '\0' ? errdetail("%s", caught->detail) : 0,
                  caught->hint[0] != '\0' ? errhint("%s", caught->hint) : 0));
  pg_unreachable();
}

static char* guc_test_fault = nullptr;

void define_boundary_settings() {
  DefineCustomStringVariable("relaybus.test_fault",
                             "Test only: makes relay._validate_route fail as the C++/PostgreSQL boundary must handle.",
                             "'' (none), 'bad_alloc', 'exception' or 'pg_error'.", &guc_test_fault, "", PGC_SUSET,
                             GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL, nullptr, nullptr, nullptr);
}

void raise_test_fault() {
  if (guc_test_fault == nullptr || guc_test_fault[0] == '\0') return;
  // Unwinding must destroy it, whichever way the error leaves.
  std::string alive = std::string("relaybus.test_fault = ") + guc_test_fault;
  if (std::strcmp(guc_test_fault, "bad_alloc") == 0) throw std::bad_alloc();
  if (std::strcmp(guc_test_fault, "exception") == 0) throw std::runtime_error(alive);
  if (std::strcmp(guc_test_fault, "pg_error") == 0)
    (void)pg_guard([] { return DirectFunctionCall2(int4div, Int32GetDatum(1), Int32GetDatum(0)); });
}

}  // namespace relaybus::pg
