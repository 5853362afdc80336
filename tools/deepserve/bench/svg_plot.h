// A line chart as a standalone SVG file (axes with "nice" ticks, grid, one polyline with point
// markers per series, legend, title, axis labels) for the concurrency sweep plots. Written by
// hand: the project's plotting library (uplot) is a browser library, no C++ plotting package is
// installed, and a chart of a few points needs only ~150 lines of SVG text.
#pragma once

#include <string>
#include <vector>

namespace ds::bench {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // same length
};

struct PlotSpec {
  std::string title, x_label, y_label;
  bool log2_x = false;  // concurrency sweeps (1, 8, 16, 64) read better on a log2 axis
  std::vector<PlotSeries> series;
  int width = 800, height = 500;
};

// The SVG document. Non-finite values are skipped; an empty plot still renders its axes.
std::string render_svg(const PlotSpec& spec);

// Tick positions covering [lo, hi] at a 1/2/5 x 10^k step (about `target` of them).
std::vector<double> nice_ticks(double lo, double hi, int target);

}  // namespace ds::bench
