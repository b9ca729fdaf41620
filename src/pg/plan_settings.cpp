#include "pg/plan_settings.hpp"

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

}  // namespace

int plan_settings_push(PlanShape shape) {
  if (shape == PlanShape::Any || IsInParallelMode()) return 0;
  int level = NewGUCNestLevel();
  if (shape == PlanShape::IndexScans)
    apply(kIndexScans);
  else
    apply(kFullScan);
  return level;
}

void plan_settings_pop(int level, bool ok) {
  if (level > 0) AtEOXact_GUC(ok, level);
}

}  // namespace relaybus::pg
