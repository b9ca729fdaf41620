#include "pg/cpp/batch_seqs.h"

#include <string_view>
#include <unordered_map>

#include "core/lane_hash.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

bool assign_batch_seqs(int n, char* const* keys, const int* key_lens, const bool* key_nulls, int nresult,
                       char* const* result_keys, const int64_t* result_last, int64_t* seqs, int16_t* lanes,
                       ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    std::unordered_map<std::string_view, int64_t> counts;
    counts.reserve(nresult * 2 + 1);
    for (int i = 0; i < n; i++)
      if (!key_nulls[i]) counts[std::string_view(keys[i], key_lens[i])]++;
    std::unordered_map<std::string_view, int64_t> next;
    next.reserve(nresult * 2 + 1);
    for (int j = 0; j < nresult; j++) {
      std::string_view k(result_keys[j]);
      auto c = counts.find(k);
      if (c == counts.end())
        throw SqlError(sqlstates::kInternalError, "key counter returned for a key not in the batch");
      next[k] = result_last[j] - c->second + 1;
    }
    for (int i = 0; i < n; i++) {
      if (key_nulls[i]) continue;
      std::string_view k(keys[i], key_lens[i]);
      auto it = next.find(k);
      if (it == next.end()) throw SqlError(sqlstates::kInternalError, "no key counter returned for a key of the batch");
      seqs[i] = it->second++;
      lanes[i] = static_cast<int16_t>(core::lane_for_key(k));
    }
  });
}

}  // namespace relaybus::pg
