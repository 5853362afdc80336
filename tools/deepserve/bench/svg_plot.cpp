// SVG line charts (see svg_plot.h).
#include "bench/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace ds::bench {
namespace {

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string tick_label(double v) {
  char buf[64];
  if (std::fabs(v) >= 1e4 || (std::fabs(v) < 1e-3 && v != 0))
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  else
    std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  // From the last tick at or below lo to the first at or above hi (the axis covers the data).
  const long long first = (long long)std::floor(lo / step + 1e-9);
  const long long last = (long long)std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (long long k = first; k <= last; ++k) ticks.push_back(double(k) * step);
  return ticks;
}

std::string render_svg(const PlotSpec& spec) {
  const double W = spec.width, H = spec.height;
  const double left = 80, right = 30, top = 50, bottom = 70;
  const double pw = W - left - right, ph = H - top - bottom;
  auto tx = [&](double x) { return spec.log2_x ? std::log2(x) : x; };

  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymax = 0;
  for (const auto& s : spec.series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (spec.log2_x && s.x[i] <= 0))
        continue;
      xmin = std::min(xmin, tx(s.x[i]));
      xmax = std::max(xmax, tx(s.x[i]));
      ymax = std::max(ymax, s.y[i]);
    }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  if (xmax == xmin) xmin -= 0.5, xmax += 0.5;
  std::vector<double> yticks = nice_ticks(0, ymax > 0 ? ymax * 1.05 : 1, 6);
  const double ytop = yticks.back();
  auto px = [&](double x) { return left + (tx(x) - xmin) / (xmax - xmin) * pw; };
  auto py = [&](double y) { return top + ph - y / ytop * ph; };

  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(spec.width) +
       "\" height=\"" + std::to_string(spec.height) + "\" viewBox=\"0 0 " +
       std::to_string(spec.width) + " " + std::to_string(spec.height) +
       "\" font-family=\"sans-serif\" font-size=\"13\">\n";
  s +=
      "<rect x=\"0\" y=\"0\" width=\"" + fmt(W) + "\" height=\"" + fmt(H) + "\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt(W / 2) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"17\">" +
       escape_xml(spec.title) + "</text>\n";
  // Grid and y ticks.
  for (double t : yticks) {
    s += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(py(t)) + "\" x2=\"" + fmt(left + pw) +
         "\" y2=\"" + fmt(py(t)) + "\" stroke=\"#dddddd\"/>\n";
    s += "<text x=\"" + fmt(left - 8) + "\" y=\"" + fmt(py(t) + 4) + "\" text-anchor=\"end\">" +
         tick_label(t) + "</text>\n";
  }
  // x ticks: the data's x values (sweep points), else nice ticks.
  std::vector<double> xticks;
  for (const auto& sr : spec.series)
    for (double x : sr.x)
      if (std::isfinite(x) && (!spec.log2_x || x > 0)) xticks.push_back(x);
  std::sort(xticks.begin(), xticks.end());
  xticks.erase(std::unique(xticks.begin(), xticks.end()), xticks.end());
  if (xticks.empty()) xticks = nice_ticks(xmin, xmax, 6);
  for (double t : xticks) {
    s += "<line x1=\"" + fmt(px(t)) + "\" y1=\"" + fmt(top) + "\" x2=\"" + fmt(px(t)) + "\" y2=\"" +
         fmt(top + ph) + "\" stroke=\"#eeeeee\"/>\n";
    s += "<text x=\"" + fmt(px(t)) + "\" y=\"" + fmt(top + ph + 20) + "\" text-anchor=\"middle\">" +
         tick_label(t) + "</text>\n";
  }
  // Axes and labels.
  s += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(top + ph) + "\" x2=\"" + fmt(left + pw) +
       "\" y2=\"" + fmt(top + ph) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(top) + "\" x2=\"" + fmt(left) + "\" y2=\"" +
       fmt(top + ph) + "\" stroke=\"black\"/>\n";
  s += "<text x=\"" + fmt(left + pw / 2) + "\" y=\"" + fmt(H - 22) + "\" text-anchor=\"middle\">" +
       escape_xml(spec.x_label) + "</text>\n";
  s += "<text x=\"18\" y=\"" + fmt(top + ph / 2) +
       "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + fmt(top + ph / 2) + ")\">" +
       escape_xml(spec.y_label) + "</text>\n";
  // Series.
  for (size_t k = 0; k < spec.series.size(); ++k) {
    const auto& sr = spec.series[k];
    const char* color = kColors[k % (sizeof(kColors) / sizeof(kColors[0]))];
    std::string points;
    std::string markers;
    for (size_t i = 0; i < std::min(sr.x.size(), sr.y.size()); ++i) {
      if (!std::isfinite(sr.x[i]) || !std::isfinite(sr.y[i]) || (spec.log2_x && sr.x[i] <= 0))
        continue;
      points += fmt(px(sr.x[i])) + "," + fmt(py(sr.y[i])) + " ";
      markers += "<circle cx=\"" + fmt(px(sr.x[i])) + "\" cy=\"" + fmt(py(sr.y[i])) +
                 "\" r=\"4\" fill=\"" + color + "\"><title>" + escape_xml(sr.name) + ": " +
                 tick_label(sr.x[i]) + ", " + fmt(sr.y[i]) + "</title></circle>\n";
    }
    if (!points.empty()) {
      points.pop_back();
      s += "<polyline fill=\"none\" stroke=\"" + std::string(color) +
           "\" stroke-width=\"2\" points=\"" + points + "\"/>\n";
    }
    s += markers;
    const double ly = top + 10 + 20 * double(k);
    s += "<line x1=\"" + fmt(left + 15) + "\" y1=\"" + fmt(ly) + "\" x2=\"" + fmt(left + 40) +
         "\" y2=\"" + fmt(ly) + "\" stroke=\"" + color + "\" stroke-width=\"3\"/>\n";
    s += "<text x=\"" + fmt(left + 46) + "\" y=\"" + fmt(ly + 4) + "\">" + escape_xml(sr.name) +
         "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace ds::bench
