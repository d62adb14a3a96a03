/// \file bench_tool.h
/// \brief What the C++ bench tools (flashstep_tile_sweep, flashstep_causal,
/// flashstep_kvcache) share: the FlashAttention-2 paper's sweep settings,
/// their exit codes, their main, the parsing of their list flags and the
/// number format of their CSV rows.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/device.h"
#include "common/error.h"

namespace flashstep::bench {

// The sweep settings of the FlashAttention-2 paper (tests/bench/sweep.py).
inline constexpr std::int64_t kHidden = 2048;   // H = kHidden / d
inline constexpr std::int64_t kTokens = 16384;  // B = kTokens / N
inline constexpr std::uint64_t kSeed = 0;       // random_inputs' seed, as sweep.py's
inline constexpr double kMsPerS = 1e3;
inline constexpr double kTera = 1e12;

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitSkipped = 77;  // CTest's SKIP_RETURN_CODE for the gpu label

/// A comma-separated list of positive integers ("64,128"), read in base 10
/// as the CLI reads numbers (std::from_chars); throws flashstep::Error naming
/// the flag and the first item that is not one.
template <typename T>
std::vector<T> parse_list(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    T v = 0;
    const char* end = item.data() + item.size();
    const auto [rest, ec] = std::from_chars(item.data(), end, v);
    if (item.empty() || ec != std::errc() || rest != end || v < 1) {
      throw Error(flag + ": '" + item + "' is not a positive integer");
    }
    out.push_back(v);
  }
  if (out.empty()) throw Error(flag + ": empty list");
  return out;
}

/// Walks argv's flags: each `--flag value` pair goes to `take(flag, value)`,
/// and each flag named in `switches` (one without a value) to
/// `take(flag, "")`; `take` returns false for a flag it does not know. A
/// flag without its value, or one `take` does not know, is an Error.
template <typename Take>
void for_each_flag(int argc, char** argv, Take take,
                   std::initializer_list<std::string_view> switches = {}) {
  for (int k = 1; k < argc; ++k) {
    const std::string flag = argv[k];
    const bool is_switch = std::find(switches.begin(), switches.end(), flag) != switches.end();
    if (!is_switch && k + 1 >= argc) throw Error(flag + ": missing value (or unknown flag)");
    const std::string value = is_switch ? std::string() : std::string(argv[++k]);
    if (!take(flag, value)) throw Error("unknown flag " + flag);
  }
}

/// --warmup N and --iters N, which every tool takes: true when `flag` is one
/// of them (its value read into warmup or iters).
inline bool take_repeats(const std::string& flag, const std::string& value, int& warmup,
                         int& iters) {
  if (flag == "--warmup") {
    warmup = parse_list<int>(flag, value).front();
  } else if (flag == "--iters") {
    iters = parse_list<int>(flag, value).front();
  } else {
    return false;
  }
  return true;
}

/// A bench tool's main: --help (or -h) prints `usage`; `parse` reads the
/// flags, and its Error is one line and the usage, exit kExitUsage; `run`
/// returns the exit code, and its Error is one line, exit kExitFailed. Each
/// line starts with the tool's `name`.
template <typename Options>
int tool_main(int argc, char** argv, const char* name, const char* usage,
              Options (*parse)(int, char**), int (*run)(const Options&)) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::cout << usage;
    return kExitOk;
  }
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const Error& e) {
    std::cerr << name << ": " << e.what() << "\n" << usage;
    return kExitUsage;
  }
  try {
    return run(o);
  } catch (const Error& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return kExitFailed;
  }
}

/// Whether a CUDA device is usable; if not, says why in one line that starts
/// with the tool's `name`.
inline bool device_usable(const char* name) {
  std::string why;
  if (cuda_device_available(&why)) return true;
  std::cerr << name << ": no usable CUDA device (" << why << ")\n";
  return false;
}

/// v with `digits` significant digits, as the CSV rows write it.
inline std::string sig(double v, int digits) {
  std::ostringstream s;
  s << std::setprecision(digits) << v;
  return s.str();
}

}  // namespace flashstep::bench
