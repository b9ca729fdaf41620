#include "pg/plan_settings.hpp"

#include "pg/pg_compat.hpp"

extern "C" {
#include "access/parallel.h"
}

namespace relaybus::pg {

namespace {

struct Setting {
  const char* name;
  const char* value;
};

// Every setting a session could have changed that would alter the shape is
// set, both ways: a consumer's SET enable_indexscan = off must not turn the
// claim scan into something else either.
constexpr Setting kIndexScans[] = {
    {"plan_cache_mode", "force_generic_plan"},  // planned once, not per call
    {"enable_seqscan", "off"},
    {"enable_bitmapscan", "off"},
    {"enable_sort", "off"},
    {"enable_indexscan", "on"},
    {"enable_indexonlyscan", "on"},
    {"jit", "off"},
};

constexpr Setting kFullScan[] = {
    {"plan_cache_mode", "force_generic_plan"},
    {"enable_seqscan", "on"},
    {"enable_indexscan", "off"},
    {"enable_indexonlyscan", "off"},
    {"enable_bitmapscan", "off"},
    {"enable_sort", "off"},
    {"enable_hashagg", "on"},
    {"jit", "off"},
};

template <size_t N>
void apply(const Setting (&settings)[N]) {
  for (const Setting& s : settings)
    (void)set_config_option(s.name, s.value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

bool hide_inner_id_indexes = false;

// An index of a relay table that holds the column id behind another column.
bool holds_id_further_in(const IndexOptInfo* index, AttrNumber id_attnum) {
  for (int k = 1; k < index->nkeycolumns; k++) {
    if (index->indexkeys[k] == id_attnum) return true;
  }
  return false;
}

void hide_indexes_for_id_lookups(Oid relid, RelOptInfo* rel) {
  if (!hide_inner_id_indexes || get_rel_namespace(relid) != get_namespace_oid("relay", true)) return;
  const AttrNumber id_attnum = get_attnum(relid, "id");
  if (id_attnum == InvalidAttrNumber) return;
  List* kept = NIL;
  ListCell* lc;
  foreach (lc, rel->indexlist) {
    IndexOptInfo* index = lfirst_node(IndexOptInfo, lc);
    if (!holds_id_further_in(index, id_attnum)) kept = lappend(kept, index);
  }
  rel->indexlist = kept;
}

}  // namespace

PlanSettingsLevel plan_settings_push(PlanShape shape) {
  PlanSettingsLevel level = {0, hide_inner_id_indexes};
  hide_inner_id_indexes = shape == PlanShape::IdLookups;
  if (shape == PlanShape::Any || IsInParallelMode()) return level;
  level.guc_level = NewGUCNestLevel();
  if (shape == PlanShape::FullScan)
    apply(kFullScan);
  else
    apply(kIndexScans);
  return level;
}

void plan_settings_pop(const PlanSettingsLevel& level, bool ok) {
  if (level.guc_level > 0) AtEOXact_GUC(ok, level.guc_level);
  hide_inner_id_indexes = level.hide_inner_id_indexes;
}

void install_plan_shape_hook() { relaybus_install_relation_info_hook(hide_indexes_for_id_lookups); }

}  // namespace relaybus::pg
