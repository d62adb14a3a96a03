#include "report.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace flashstep::cli {

namespace {
// Decimal unit steps for the pretty forms (kB, MB, ...; k, M, G, ...).
constexpr double kUnitStep = 1000.0;

std::string scaled(double v, const char* const* units, int n_units) {
  int u = 0;
  while (std::abs(v) >= kUnitStep && u + 1 < n_units) {
    v /= kUnitStep;
    ++u;
  }
  std::ostringstream s;
  s << std::fixed << std::setprecision(u == 0 ? 0 : 1) << v << units[u];
  return s.str();
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

bool hidden(const std::string& column) { return !column.empty() && column[0] == '.'; }
std::string key(const std::string& column) { return hidden(column) ? column.substr(1) : column; }
}  // namespace

Cell text(const std::string& s) { return {s, s, false}; }

Cell integer(long long v) { return {std::to_string(v), std::to_string(v), true}; }

Cell number(double v, int precision) {
  if (std::isnan(v)) return {"", "-", true};
  std::ostringstream s;
  s << std::setprecision(precision) << v;
  return {s.str(), s.str(), true};
}

Cell bytes(long long v) {
  static const char* const units[] = {" B", " kB", " MB", " GB", " TB", " PB"};
  return {std::to_string(v), scaled(static_cast<double>(v), units, 6), true};
}

Cell flops(long long v) {
  static const char* const units[] = {"", " k", " M", " G", " T", " P"};
  return {std::to_string(v), scaled(static_cast<double>(v), units, 6), true};
}

void print(const Report& r, Format format, std::ostream& out) {
  const size_t n = r.columns.size();
  if (format == Format::kCsv) {
    for (size_t c = 0; c < n; ++c) out << (c ? "," : "") << csv_field(key(r.columns[c]));
    out << "\n";
    for (const auto& row : r.rows) {
      for (size_t c = 0; c < n; ++c) out << (c ? "," : "") << csv_field(row[c].raw);
      out << "\n";
    }
    return;
  }
  if (format == Format::kJson) {
    out << "[\n";
    for (size_t k = 0; k < r.rows.size(); ++k) {
      out << "  {";
      for (size_t c = 0; c < n; ++c) {
        const Cell& cell = r.rows[k][c];
        const std::string value = !cell.numeric   ? json_string(cell.raw)
                                  : cell.raw.empty() ? std::string("null")
                                                     : cell.raw;
        out << (c ? ", " : "") << json_string(key(r.columns[c])) << ": " << value;
      }
      out << "}" << (k + 1 < r.rows.size() ? "," : "") << "\n";
    }
    out << "]\n";
    return;
  }
  std::vector<size_t> width(n, 0);
  for (size_t c = 0; c < n; ++c) {
    if (hidden(r.columns[c])) continue;
    width[c] = r.columns[c].size();
    for (const auto& row : r.rows) width[c] = std::max(width[c], row[c].pretty.size());
  }
  if (!r.title.empty()) out << r.title << "\n";
  auto line = [&](auto cell_of) {
    bool first = true;
    for (size_t c = 0; c < n; ++c) {
      if (hidden(r.columns[c])) continue;
      const std::string s = cell_of(c);
      out << (first ? "" : "  ");
      first = false;
      // Text left-aligned, numbers right-aligned.
      const bool right = !r.rows.empty() && r.rows[0][c].numeric;
      out << (right ? std::right : std::left) << std::setw(static_cast<int>(width[c])) << s;
    }
    out << "\n";
  };
  line([&](size_t c) { return r.columns[c]; });
  for (const auto& row : r.rows) line([&](size_t c) { return row[c].pretty; });
}

}  // namespace flashstep::cli
