#include "pg/spi_support.hpp"

#include <cstring>

#include "pg/pg_compat.hpp"

extern "C" {
#include "catalog/pg_namespace.h"
#include "datatype/timestamp.h"
}

namespace relaybus::pg {

static Oid relay_schema_owner() {
  Oid nsp = get_namespace_oid("relay", true);
  if (!OidIsValid(nsp))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_SCHEMA), errmsg("schema \"relay\" does not exist"),
                    errhint("Run CREATE EXTENSION relaybus in this database.")));
  HeapTuple tup = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(nsp));
  if (!HeapTupleIsValid(tup)) elog(ERROR, "cache lookup failed for namespace %u", nsp);
  Oid owner = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tup))->nspowner;
  ReleaseSysCache(tup);
  return owner;
}

// relaybus's statements run with search_path = 'pg_catalog, pg_temp', in a GUC
// nest level of their own, so that a caller's search_path can neither redirect
// them (a schema of the caller's listed before pg_catalog, with an operator or
// function of the same name) nor slow them down (a long path to resolve).
// A session whose search_path is that already (the dispatchers pin it,
// session_settings.cpp) skips the nest level: the setting would change nothing.
// An error before spi_end leaves the level to the (sub)transaction's abort,
// which restores the caller's search_path as it closes SPI.
static int restrict_search_path() {
  if (namespace_search_path != nullptr && strcmp(namespace_search_path, RELAYBUS_SAFE_SEARCH_PATH) == 0) return 0;
  int level = NewGUCNestLevel();
  relaybus_restrict_search_path();
  return level;
}

void spi_begin(SpiScope* scope) {
  Oid owner = relay_schema_owner();
  if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "relaybus: SPI_connect failed");
  GetUserIdAndSecContext(&scope->saved_user, &scope->saved_sec_context);
  SetUserIdAndSecContext(owner, scope->saved_sec_context | SECURITY_LOCAL_USERID_CHANGE);
  scope->search_path_level = restrict_search_path();
}

void spi_end(SpiScope* scope) {
  if (scope->search_path_level > 0) AtEOXact_GUC(true, scope->search_path_level);
  SetUserIdAndSecContext(scope->saved_user, scope->saved_sec_context);
  SPI_finish();
}

SPIPlanPtr plan_of(SavedPlan* p) {
  if (p->plan == nullptr) {
    SPIPlanPtr plan = SPI_prepare(p->sql, p->nargs, p->argtypes);
    if (plan == nullptr) elog(ERROR, "relaybus: could not prepare statement: %s", SPI_result_code_string(SPI_result));
    if (SPI_keepplan(plan) != 0) elog(ERROR, "relaybus: SPI_keepplan failed");
    p->plan = plan;
  }
  return p->plan;
}

static int check(int rc, const SavedPlan* p) {
  if (rc < 0) elog(ERROR, "relaybus: statement failed (%s): %s", SPI_result_code_string(rc), p->sql);
  return rc;
}

// Executes p (with snapshot, or the caller's statement snapshot when
// InvalidSnapshot) under its plan settings, which also apply to any planning
// this execution does.
static int execute(SavedPlan* p, Snapshot snapshot, Datum* values, const char* nulls, bool read_only, long tcount) {
  SPIPlanPtr plan = plan_of(p);
  const PlanSettingsLevel level = plan_settings_push(p->shape);
  int rc = 0;
  PG_TRY();
  {
    rc = snapshot != InvalidSnapshot
             ? SPI_execute_snapshot(plan, values, nulls, snapshot, InvalidSnapshot, read_only, true, tcount)
             : SPI_execute_plan(plan, values, nulls, read_only, tcount);
  }
  PG_CATCH();
  {
    // A caller that catches the error (pg_catch) goes on in this
    // transaction: its own statements must not run under these settings.
    plan_settings_pop(level, false);
    PG_RE_THROW();
  }
  PG_END_TRY();
  plan_settings_pop(level, true);
  return check(rc, p);
}

int spi_exec_latest(SavedPlan* p, Datum* values, const char* nulls, bool read_only, long tcount, TransactionId* xmin) {
  Snapshot snap = GetLatestSnapshot();
  if (xmin != nullptr) *xmin = snap->xmin;
  return execute(p, snap, values, nulls, read_only, tcount);
}

int spi_exec(SavedPlan* p, Datum* values, const char* nulls, bool read_only, long tcount) {
  return execute(p, InvalidSnapshot, values, nulls, read_only, tcount);
}

Datum spi_col(int row, int col, bool* isnull) {
  return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

int64 spi_int64(int row, int col) {
  bool isnull = false;
  Datum d = spi_col(row, col, &isnull);
  return isnull ? 0 : DatumGetInt64(d);
}

char* text_arg(FunctionCallInfo fcinfo, int argno, int* len) {
  text* t = PG_GETARG_TEXT_PP(argno);
  if (len != nullptr) *len = VARSIZE_ANY_EXHDR(t);
  return text_to_cstring(t);
}

int64 interval_to_ms(const Interval* iv) {
  // Months count as 30 days, as PostgreSQL's interval comparison does.
  return iv->time / 1000 + static_cast<int64>(iv->day) * 86400000LL + static_cast<int64>(iv->month) * 30LL * 86400000LL;
}

int64 timestamptz_to_epoch_ms(TimestampTz t) {
  return (t / 1000) + (static_cast<int64>(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * 86400000LL);
}

}  // namespace relaybus::pg
