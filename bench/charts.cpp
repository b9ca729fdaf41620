#include "charts.hpp"

#include <algorithm>
#include <cmath>

#include "util.hpp"

namespace bench {

namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += ch;
    }
  }
  return o;
}

// Colour-blind-safe (Okabe-Ito) fills for up to four series.
const char* fill_of(size_t series) {
  static const char* fills[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7"};
  return fills[series % 4];
}

std::string value_text(double v, const std::string& unit) { return (std::fabs(v) >= 100 ? num(v) : num(v, 2)) + unit; }

}  // namespace

std::string chart_svg(const Chart& c) {
  const int bar_h = 14, gap = 8, label_w = 300, plot_w = 420, value_w = 90, top = 34;
  const size_t n_series = std::max<size_t>(1, c.series.size());
  const int legend_h = c.series.size() > 1 ? 20 : 0;
  const int group_h = static_cast<int>(n_series) * bar_h + gap;
  const int height = top + legend_h + static_cast<int>(c.rows.size()) * group_h + 24;
  const int width = label_w + plot_w + value_w;

  double max_v = c.reference;
  for (const ChartRow& r : c.rows)
    for (double v : r.values)
      if (std::isfinite(v)) max_v = std::max(max_v, v);
  if (!(max_v > 0)) max_v = 1;
  auto x_of = [&](double v) { return label_w + plot_w * std::max(0.0, v) / max_v; };

  std::string s = strf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  s += strf("<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", width, height);
  s += strf("<text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", xml_escape(c.title).c_str());
  if (c.series.size() > 1)
    for (size_t k = 0; k < c.series.size(); k++) {
      const int x = label_w + static_cast<int>(k) * 90;
      s += strf("<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>", x, top, fill_of(k));
      s += strf("<text x=\"%d\" y=\"%d\">%s</text>\n", x + 14, top + 9, xml_escape(c.series[k]).c_str());
    }
  int y = top + legend_h;
  for (const ChartRow& r : c.rows) {
    s += strf("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", label_w - 6,
              y + static_cast<int>(n_series) * bar_h / 2 + 4, xml_escape(r.label).c_str());
    for (size_t k = 0; k < r.values.size(); k++) {
      const double v = r.values[k];
      const int by = y + static_cast<int>(k) * bar_h;
      if (!std::isfinite(v)) {
        s += strf("<text x=\"%d\" y=\"%d\" fill=\"#666666\">not measured</text>\n", label_w + 4, by + 11);
        continue;
      }
      const double w = x_of(v) - label_w;
      s += strf("<rect class=\"bar\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" data-value=\"%g\"/>",
                label_w, by + 1, w, bar_h - 2, fill_of(k), v);
      s += strf("<text x=\"%.1f\" y=\"%d\">%s</text>\n", x_of(v) + 4, by + 11,
                xml_escape(value_text(v, c.unit)).c_str());
    }
    y += group_h;
  }
  if (c.reference > 0) {
    const double x = x_of(c.reference);
    s += strf("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333333\" stroke-dasharray=\"4 3\"/>\n", x,
              top + legend_h - 4, x, y);
    s += strf("<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#333333\">%s</text>\n", x, y + 14,
              xml_escape(value_text(c.reference, c.unit)).c_str());
  }
  s += "</svg>\n";
  return s;
}

}  // namespace bench
