#include "mongo/window_plan.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace relaybus::mongo {

WindowPlanIds window_plan_ids(const std::vector<Delivery>& window) {
  WindowPlanIds out;
  for (size_t i = 0; i < window.size(); i++)
    if (window[i].malformed.empty()) out.rows.push_back(i);
  std::map<std::string, std::vector<size_t>> by_key;
  for (size_t i : out.rows)
    if (window[i].has_key) by_key[window[i].key].push_back(i);
  out.plan_id.assign(window.size(), 0);
  for (size_t i : out.rows) out.plan_id[i] = window[i].id;
  for (auto& [key, members] : by_key) {
    std::vector<int64_t> ids;
    for (size_t i : members) ids.push_back(window[i].id);
    std::sort(ids.begin(), ids.end());
    std::sort(members.begin(), members.end(),
              [&](size_t a, size_t b) { return window[a].seq < window[b].seq; });
    for (size_t k = 0; k < members.size(); k++) out.plan_id[members[k]] = ids[k];
  }
  return out;
}

}  // namespace relaybus::mongo
