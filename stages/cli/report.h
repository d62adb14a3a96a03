/// \file report.h
/// \brief One table, printed as aligned text, CSV or JSON.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "cli.h"

namespace flashstep::cli {

/// One cell: the exact value (CSV, JSON) and a short form for the text table.
struct Cell {
  std::string raw;     ///< e.g. "268435456" or "01_naive"
  std::string pretty;  ///< e.g. "268.4 MB"
  bool numeric = false;  ///< unquoted in JSON
};

Cell text(const std::string& s);          ///< a string cell
Cell integer(long long v);                ///< an exact integer
Cell number(double v, int precision = 4); ///< a float (NaN prints as empty / null)
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
