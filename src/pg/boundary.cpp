#include "pg/boundary.hpp"

#include <cstring>

extern "C" {
#include "utils/fmgrprotos.h"
}

namespace relaybus::pg {

static_assert(sqlstate("22023") == ERRCODE_INVALID_PARAMETER_VALUE, "sqlstate() packs as MAKE_SQLSTATE");
static_assert(sqlstates::kOutOfMemory == ERRCODE_OUT_OF_MEMORY, "sqlstate() packs as MAKE_SQLSTATE");
static_assert(sqlstates::kInternalError == ERRCODE_INTERNAL_ERROR, "sqlstate() packs as MAKE_SQLSTATE");

void record_pg_error(ErrorRecord* err, ErrorData* error) {
  err->pg_error = error;
  err->sqlstate = error->sqlerrcode;
  copy_error_text(err->message, error->message != nullptr ? error->message : "PostgreSQL error");
  copy_error_text(err->detail, error->detail);
  copy_error_text(err->hint, error->hint);
}

void raise_error(const ErrorRecord* err) {
  if (err->pg_error != nullptr) ReThrowError(static_cast<ErrorData*>(err->pg_error));
  ereport(ERROR, (errcode(err->sqlstate), errmsg("%s", err->message),
                  err->detail[0] != '\0' ? errdetail("%s", err->detail) : 0,
                  err->hint[0] != '\0' ? errhint("%s", err->hint) : 0));
  pg_unreachable();
}

bool pg_strdup(const char* s, char** out, ErrorRecord* err) noexcept {
  return pg_catch(err, [&] { *out = pstrdup(s); });
}

void raise_error_in(const char* what, const ErrorRecord* err) {
  if (err->pg_error != nullptr) ReThrowError(static_cast<ErrorData*>(err->pg_error));
  ereport(ERROR, (errcode(err->sqlstate), errmsg("%s: %s", what, err->message),
                  err->detail[0] != '\0' ? errdetail("%s", err->detail) : 0,
                  err->hint[0] != '\0' ? errhint("%s", err->hint) : 0));
  pg_unreachable();
}

static char* guc_test_fault = nullptr;

void define_boundary_settings() {
  DefineCustomStringVariable("relaybus.test_fault",
                             "Test only: makes relay._validate_route fail as the C++/PostgreSQL boundary must handle.",
                             "'' (none), 'bad_alloc', 'exception' or 'pg_error'.", &guc_test_fault, "", PGC_SUSET,
                             GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL, nullptr, nullptr, nullptr);
}

const char* test_fault_setting() noexcept { return guc_test_fault != nullptr ? guc_test_fault : ""; }

bool test_fault_pg_error(ErrorRecord* err) noexcept {
  return pg_catch(err, [] { (void)DirectFunctionCall2(int4div, Int32GetDatum(1), Int32GetDatum(0)); });
}

}  // namespace relaybus::pg
