#pragma once

#include <string>
#include <vector>

#include "model.hpp"

namespace bench {

// Every cell of a full run (full_matrix: the whole publish cross product).
std::vector<Cell> all_cells(bool full_matrix);
// Comma-separated patterns: a glob (fnmatch) or, without wildcards, a substring.
bool cell_matches(const Cell& c, const std::string& patterns);
// The cells to run; with_floors adds the floor each selected cell compares with.
std::vector<Cell> select_cells(const std::vector<Cell>& all, bool quick, const std::string& patterns, bool with_floors);

}  // namespace bench
