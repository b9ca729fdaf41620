// Planner settings under which relaybus's hot statements are planned, so that
// their plan shape does not depend on relay.deliveries' statistics.
//
// A plan cached on an empty or tiny table (a quiet system) used to stay a
// sequential scan plus sort until the next ANALYZE, whatever the backlog grew
// to. The settings are in force around every execution, not only the first:
// PostgreSQL re-plans a cached statement whenever an ANALYZE, a VACUUM or DDL
// invalidates it, and it does so inside the execution, with the settings of
// that moment. See docs/performance.md, "Plans after idle".
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

enum class PlanShape : uint8 {
  // Planned with the caller's settings (catalog reads and the like).
  Any = 0,
  // Generic plan, index scans only: no sequential or bitmap scan and no
  // sort. Each statement is written so that one index alone provides its
  // rows in the order it needs (see claim.cpp): that index scan is then the
  // only plan left, for 0 rows as for 10 million.
  IndexScans,
  // IndexScans for statements that find rows by id: besides, the planner
  // does not see the indexes of relay tables that hold id behind another
  // column. deliveries_claim (handler_id, priority, id) could answer
  // `id = ANY ($1)` by reading all of itself, and the planner takes that
  // when pg_class says 0 rows in N pages (a VACUUM that found only dead
  // rows and kept the pages), however many rows have arrived since.
  IdLookups,
  // Generic plan, a sequential scan and hash aggregation (counts over the
  // whole table).
  FullScan,
};

// Opens a GUC nest level with the settings of shape (guc_level 0 when nothing
// was set: PlanShape::Any, or in parallel mode, where settings cannot change)
// and turns IdLookups' rule on or off for the planning it may do. plan_settings_pop
// restores both; an error that nobody pops for leaves the settings to the
// (sub)transaction's end, and the rule to the next push.
struct PlanSettingsLevel {
  int guc_level;
  bool hide_inner_id_indexes;  // IdLookups' rule before the push
};
PlanSettingsLevel plan_settings_push(PlanShape shape);
void plan_settings_pop(const PlanSettingsLevel& level, bool ok);

// From _PG_init: the planner hook that applies IdLookups' rule.
void install_plan_shape_hook();

}  // namespace relaybus::pg
