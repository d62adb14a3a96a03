#include "report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <type_traits>
#include <utility>

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

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

bool hidden(const std::string& column) { return !column.empty() && column[0] == '.'; }
bool numeric(const Cell& cell) { return !std::holds_alternative<std::string>(cell.value); }
std::string key(const std::string& column) { return hidden(column) ? column.substr(1) : column; }
}  // namespace

Cell text(const std::string& s) { return {s, s, s}; }

Cell integer(long long v) { return {std::to_string(v), std::to_string(v), v}; }

Cell number(double v, int precision) {
  if (std::isnan(v)) return {"", "-", std::monostate{}};
  std::ostringstream s;
  s << std::setprecision(precision) << v;
  if (!std::isfinite(v)) return {s.str(), s.str(), std::monostate{}};
  // JSON holds what CSV shows: the value rounded to `precision` digits.
  return {s.str(), s.str(), std::strtod(s.str().c_str(), nullptr)};
}

Cell bytes(long long v) {
  static const char* const units[] = {" B", " kB", " MB", " GB", " TB", " PB"};
  return {std::to_string(v), scaled(static_cast<double>(v), units, 6), v};
}

Cell flops(long long v) {
  static const char* const units[] = {"", " k", " M", " G", " T", " P"};
  return {std::to_string(v), scaled(static_cast<double>(v), units, 6), v};
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
    // An array of one object per row, keys in column order. Strings that are
    // not valid UTF-8 (a GPU name, say) get U+FFFD rather than an exception.
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& row : r.rows) {
      nlohmann::ordered_json object = nlohmann::ordered_json::object();
      for (size_t c = 0; c < n; ++c) {
        object[key(r.columns[c])] = std::visit(
            [](const auto& v) -> nlohmann::ordered_json {
              if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::monostate>) {
                return nullptr;
              } else {
                return v;
              }
            },
            row[c].value);
      }
      rows.push_back(std::move(object));
    }
    constexpr int kIndent = 2;
    out << rows.dump(kIndent, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
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
      const bool right = !r.rows.empty() && numeric(r.rows[0][c]);
      out << (right ? std::right : std::left) << std::setw(static_cast<int>(width[c])) << s;
    }
    out << "\n";
  };
  line([&](size_t c) { return r.columns[c]; });
  for (const auto& row : r.rows) line([&](size_t c) { return row[c].pretty; });
}

}  // namespace flashstep::cli
