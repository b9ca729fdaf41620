#include "agent/limits.hpp"

#include <algorithm>

#include "core/json_log.hpp"

namespace relaybus::agent {

namespace {
// Without a permit asked for this long (and none out), the handler's locks go
// back: another agent may need them, and an idle agent must not take a share
// of the rate.
constexpr int64_t kIdleMs = 1000;
// How often a member counts the handler's agents again: a change of them
// re-splits the rate within this (docs/managed.md: the overshoot it allows).
constexpr int64_t kRefreshMs = 500;
// Short of slots: asked again this often (another agent may give some back).
constexpr int64_t kSlotRetryMs = 100;

// The slot's second key: exact (handler = key >> 17, slot = key & 131071)
// for handler ids below 16384; beyond, two slots may share a lock, which
// only lowers what the handler gets, never raises it.
const char* const kSlotKey = "((($2::bigint << 17) + i) % 2147483648)::int";

std::string slots_literal(const std::vector<int>& slots, size_t from) {
  std::string s = "{";
  for (size_t i = from; i < slots.size(); i++) s += (i > from ? "," : "") + std::to_string(slots[i]);
  return s + "}";
}
}  // namespace

int SharedLimits::usable_slots(const State& s, const core::HandlerOptions& o) {
  return static_cast<int>(std::count_if(s.slots.begin(), s.slots.end(), [&](int i) { return i < o.max_concurrency; }));
}

int SharedLimits::target_slots(const State& s, const core::HandlerOptions& o) {
  if (o.max_concurrency <= 0) return 0;
  const int agents = std::max(1, s.agents);
  return std::min(o.max_concurrency, (o.max_concurrency + agents - 1) / agents);
}

bool SharedLimits::active(const State& s, int64_t now_ms) {
  return s.use.in_use() > 0 || (s.demand_ms >= 0 && now_ms - s.demand_ms < kIdleMs);
}

bool SharedLimits::acquire(const core::PipelineHandler& h, int64_t now_ms, int64_t* retry_in_ms) {
  State& s = states_[h.key];
  s.demand_ms = now_ms;
  const core::HandlerOptions& o = h.options;
  if (!s.member) {
    *retry_in_ms = kSlotRetryMs;
    return false;
  }
  return s.use.take(o.max_concurrency > 0 ? usable_slots(s, o) : -1, core::split_limits(o, s.agents, 0), now_ms,
                    kSlotRetryMs, retry_in_ms);
}

void SharedLimits::release(const core::PipelineHandler& h) {
  auto it = states_.find(h.key);
  if (it != states_.end()) it->second.use.give_back();
}

void SharedLimits::held_back(const core::PipelineHandler& h, int waited, int64_t now_ms) {
  State& s = states_[h.key];
  if (!s.use.note_held_back(waited, now_ms)) return;
  nlohmann::json f = core::held_back_fields(h);
  f["slots"] = s.slots.size();
  f["agents"] = s.member ? s.agents : 0;
  core::log_info("handler held back by its limits", f);
}

core::HandlerOptions SharedLimits::claim_limits(const core::PipelineHandler& h) const {
  auto it = states_.find(h.key);
  const State none;
  const State& s = it == states_.end() ? none : it->second;
  core::HandlerOptions o = core::split_limits(h.options, s.agents, 0);
  if (o.max_concurrency > 0) o.max_concurrency = std::max(1, usable_slots(s, h.options));
  return o;
}

void SharedLimits::give_back(PgConn& conn, int key, State& s, size_t keep) {
  if (s.slots.size() <= keep) return;
  conn.exec(std::string("SELECT count(pg_advisory_unlock($1::int, ") + kSlotKey + ")) FROM unnest($3::int[]) i",
            {std::to_string(kSlotLockSpace), std::to_string(key), slots_literal(s.slots, keep)});
  s.slots.resize(keep);
}

void SharedLimits::leave(PgConn& conn, int key, State& s) {
  give_back(conn, key, s, 0);
  if (!s.member) return;
  conn.exec("SELECT pg_advisory_unlock_shared($1::int, $2::int)",
            {std::to_string(kMemberLockSpace), std::to_string(key)});
  s.member = false;
  s.agents = 1;
}

void SharedLimits::sync(PgConn& conn, const std::map<int, const core::PipelineHandler*>& limited, int64_t now_ms) {
  for (auto it = states_.begin(); it != states_.end();) {
    if (limited.count(it->first) != 0) {
      ++it;
      continue;
    }
    leave(conn, it->first, it->second);
    it = states_.erase(it);
  }
  for (const auto& [key, h] : limited) {
    auto found = states_.find(key);
    if (found == states_.end()) continue;  // no work here yet (acquire makes the state)
    State& s = found->second;
    if (!active(s, now_ms)) {
      leave(conn, key, s);
      s.demand_ms = -1;
      continue;
    }
    const core::HandlerOptions& o = h->options;
    if (!s.member) {
      if (now_ms < s.retry_slots_ms) continue;
      // Shared: every agent with work holds it; only an application taking
      // the same key exclusively could refuse it (then asked again later).
      PgResult r = conn.exec("SELECT pg_try_advisory_lock_shared($1::int, $2::int)",
                             {std::to_string(kMemberLockSpace), std::to_string(key)});
      if (r.text(0, 0) != "t") {
        s.retry_slots_ms = now_ms + kRefreshMs;
        continue;
      }
      s.member = true;
      s.refresh_ms = 0;
    }
    if (now_ms >= s.refresh_ms) {
      PgResult r = conn.exec(
          "SELECT count(DISTINCT pid) FROM pg_catalog.pg_locks"
          " WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = $1::int::oid"
          "   AND objid = $2::int::oid"
          "   AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())",
          {std::to_string(kMemberLockSpace), std::to_string(key)});
      const int before = s.agents;
      s.agents = std::max(1, static_cast<int>(r.integer(0, 0)));
      s.refresh_ms = now_ms + kRefreshMs;
      if (before != s.agents) s.use.clamp_burst(core::split_limits(o, s.agents, 0).burst);
    }
    const int target = target_slots(s, o);
    // Slots are ascending: those below max_concurrency come first. Kept: this
    // agent's share of them, or as many as its requests out still use.
    const int usable = usable_slots(s, o);
    give_back(conn, key, s, static_cast<size_t>(std::max(std::min(target, usable), s.use.in_use())));
    const int have = usable_slots(s, o);
    s.short_of_slots = have < target;
    if (!s.short_of_slots || now_ms < s.retry_slots_ms) continue;
    // One statement tries the free slots in turn and stops at the share; the
    // CASE keeps a slot already held from being locked twice (a count of 2
    // would outlive one unlock).
    PgResult r = conn.exec(std::string("SELECT i FROM generate_series(0, $3::int - 1) i"
                                       " WHERE CASE WHEN i = ANY($4::int[]) THEN false"
                                       "            ELSE pg_try_advisory_lock($1::int, ") +
                               kSlotKey + ") END LIMIT $5::int",
                           {std::to_string(kSlotLockSpace), std::to_string(key), std::to_string(o.max_concurrency),
                            slots_literal(s.slots, 0), std::to_string(target - have)});
    for (int i = 0; i < r.rows(); i++) s.slots.push_back(static_cast<int>(r.integer(i, 0)));
    std::sort(s.slots.begin(), s.slots.end());
    s.short_of_slots = have + r.rows() < target;
    if (s.short_of_slots) s.retry_slots_ms = now_ms + kSlotRetryMs;
  }
}

int64_t SharedLimits::next_sync_ms() const {
  int64_t next = -1;
  auto at = [&](int64_t t) { next = next < 0 ? t : std::min(next, t); };
  for (const auto& [key, s] : states_) {
    if (!s.member) {
      // Work, and not yet counted among the handler's agents: join now.
      if (s.demand_ms >= 0 || s.use.in_use() > 0) at(std::max({int64_t{0}, s.demand_ms, s.retry_slots_ms}));
      continue;
    }
    at(s.refresh_ms);
    if (s.use.in_use() == 0) at(s.demand_ms + kIdleMs);
    if (s.short_of_slots) at(s.retry_slots_ms);
  }
  return next;
}

void SharedLimits::connection_lost() {
  for (auto& [key, s] : states_) {
    s.slots.clear();
    s.member = false;
    s.agents = 1;
    s.short_of_slots = false;
  }
}

SharedLimits::View SharedLimits::view(int key, int64_t now_ms) const {
  View v;
  auto it = states_.find(key);
  if (it == states_.end()) return v;
  v.slots = static_cast<int>(it->second.slots.size());
  v.agents = it->second.member ? it->second.agents : 0;
  v.held_back = it->second.use.held_back();
  v.limited = it->second.use.limited(now_ms);
  return v;
}

}  // namespace relaybus::agent
