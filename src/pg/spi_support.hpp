// Running relaybus's own statements: as the extension owner, with search_path
// 'pg_catalog, pg_temp' (every relaybus object is schema-qualified), through
// plans prepared once per backend.
#pragma once

#include "pg/pg_includes.hpp"
#include "pg/plan_settings.hpp"

namespace relaybus::pg {

// A statement prepared on first use and kept for the life of the backend.
// shape: the planner settings every execution runs under (plan_settings.hpp),
// so that a re-plan after an invalidation keeps the same shape.
struct SavedPlan {
  const char* sql;
  int nargs;
  Oid argtypes[16];
  SPIPlanPtr plan;
  PlanShape shape = PlanShape::Any;
};

// Opens SPI, switches to the owner of schema relay and sets search_path to
// 'pg_catalog, pg_temp' until spi_end().
struct SpiScope {
  Oid saved_user;
  int saved_sec_context;
  int search_path_level;  // the GUC nest level spi_end closes, or 0
};
void spi_begin(SpiScope* scope);
void spi_end(SpiScope* scope);

SPIPlanPtr plan_of(SavedPlan* p);

// Executes with a fresh snapshot, so relaybus sees the latest committed state
// even inside a REPEATABLE READ or SERIALIZABLE caller.
int spi_exec_latest(SavedPlan* p, Datum* values, const char* nulls, bool read_only, long tcount,
                    TransactionId* xmin = nullptr);
// Executes with the caller's statement snapshot.
int spi_exec(SavedPlan* p, Datum* values, const char* nulls, bool read_only, long tcount);

// Column helpers for SPI_tuptable rows (1-based columns).
Datum spi_col(int row, int col, bool* isnull);
int64 spi_int64(int row, int col);

// "name" of a text argument as a NUL-terminated palloc'd string, with its length.
char* text_arg(FunctionCallInfo fcinfo, int argno, int* len);

int64 interval_to_ms(const Interval* iv);
int64 timestamptz_to_epoch_ms(TimestampTz t);

}  // namespace relaybus::pg
