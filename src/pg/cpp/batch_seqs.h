// A publish batch's seqs and lanes from its key counters (C++,
// cpp/batch_seqs.cpp; the counters are read by publish.cpp).
#pragma once

#include <cstdint>

#include "pg/cpp/boundary.h"

namespace relaybus::pg {

// Per event of a batch, its seq from the counters the upsert returned: the
// statement returns each key's last seq (result_keys[j], result_last[j]); the
// batch's occurrences of that key take the values just below it, in batch
// order. Fills seqs[i] and lanes[i] of every keyed event; false with *err
// filled (XX000) if the counters do not match the batch's keys.
bool assign_batch_seqs(int n, char* const* keys, const int* key_lens, const bool* key_nulls, int nresult,
                       char* const* result_keys, const int64_t* result_last, int64_t* seqs, int16_t* lanes,
                       ErrorRecord* err) noexcept;

}  // namespace relaybus::pg
