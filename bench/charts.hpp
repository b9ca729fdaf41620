// SVG charts for the bench report, drawn beside its tables: plain SVG 1.1
// text (no script, no external font or stylesheet), so GitHub and any
// browser show it from the report's directory.
#pragma once

#include <string>
#include <vector>

namespace bench {

struct ChartRow {
  std::string label;           // the cell
  std::vector<double> values;  // one per series; NaN: not measured (no bar)
};

struct Chart {
  std::string title;
  std::string unit;                 // after each value: "x", " ms"
  std::vector<std::string> series;  // legend; one entry draws none
  std::vector<ChartRow> rows;
  double reference = 0;  // > 0: a dashed line there (1.0 for ratios)
};

// Horizontal bars, one group per row, each labelled with its value.
std::string chart_svg(const Chart& c);

}  // namespace bench
