/// \file report.h
/// \brief One table, printed as aligned text, CSV or JSON (nlohmann-json).
#pragma once

#include <iosfwd>
#include <string>
#include <variant>
#include <vector>

#include "cli.h"

namespace flashstep::cli {

/// One cell: the value as CSV writes it, a short form for the text table, and
/// the value JSON holds.
struct Cell {
  std::string raw;     ///< CSV, e.g. "268435456" or "01_naive"
  std::string pretty;  ///< the text table, e.g. "268.4 MB"
  /// JSON: a string, an integer, a number, or nothing (null): a NaN or
  /// infinite number, which JSON cannot hold.
  std::variant<std::monostate, std::string, long long, double> value;
};

Cell text(const std::string& s);          ///< a string cell
Cell integer(long long v);                ///< an exact integer
/// A float with `precision` significant digits in every format. NaN is
/// empty in CSV, "-" in the table, null in JSON; an infinity is "inf" or
/// "-inf" in CSV and the table, null in JSON.
Cell number(double v, int precision = 4);
Cell bytes(long long v);                  ///< an exact byte count, pretty in kB/MB/GB
Cell flops(long long v);                  ///< an exact FLOP count, pretty in M/G/T

/// Rows with named columns. A column whose name starts with '.' is written
/// to CSV and JSON only (the table's title line already says it).
struct Report {
  std::string title;                   ///< first line of the text table
  std::vector<std::string> columns;    ///< column names (CSV header, JSON keys)
  std::vector<std::vector<Cell>> rows; ///< one Cell per column
};

/// Prints `r` in `format` to `out`.
void print(const Report& r, Format format, std::ostream& out);

}  // namespace flashstep::cli
