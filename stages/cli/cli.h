/// \file cli.h
/// \brief The `flashstep` command: run every stage on one problem, check each
/// against the fp64 reference, time it, and print it beside its model.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/problem.h"

namespace CLI {
class App;
}

namespace flashstep::cli {

/// What `flashstep` prints.
enum class Format { kTable, kCsv, kJson };

/// What `flashstep` does.
enum class Mode {
  kRun,    ///< run, check and time the stages (model only when there is no GPU)
  kModel,  ///< print the stages' modelled traffic and FLOPs; touches no GPU
  kInfo,   ///< print the GPU's facts every recorded result carries
  kHelp,   ///< print usage
};

/// Parsed command line.
struct Options {
  Mode mode = Mode::kRun;
  Problem problem;             ///< default B=1, H=8, N=1024, d=64, non-causal; dtype: --dtype's
  std::vector<std::string> stages = {"all"};  ///< --stage's selectors (see select_stages)
  /// --dtype: every selected stage that runs in this type runs in it, the
  /// others are skipped (with a note); unset: each stage in its native type.
  std::optional<DType> dtype;
  int warmup = 3;              ///< untimed runs before timing
  int iterations = 20;         ///< timed runs (median, p20, p80); 0: run once, untimed
  Format format = Format::kTable;
  std::string load_dir;        ///< read Q.npy, K.npy, V.npy from here
  std::string save_dir;        ///< write inputs and each stage's O, L here
  bool overwrite = false;      ///< let --save replace files already in save_dir
  std::uint64_t seed = 0;      ///< seed of the random inputs
  bool check = true;           ///< compare with the fp64 reference
  bool backward = false;       ///< also run the backward (stages that have one)
  std::set<std::string> given; ///< the flags given on the command line
};

/// Parses arguments (without the program name). Throws flashstep::Error with
/// a one-line message on an unknown flag, a missing or malformed value, or a
/// problem that breaks the contract.
Options parse_args(const std::vector<std::string>& args);

/// The usage text.
std::string usage();

/// Reads `args` (without the program name) into `app` the way every
/// flashstep command does, with each failure in flashstep's words: throws
/// flashstep::Error "--N expects a value" for an option at the end without
/// its value, "unknown argument 'X'" for anything left over, and CLI11's own
/// message for the rest. Returns false when --help was asked (nothing else is
/// checked then), true otherwise. `flashstep_ring` parses with it too.
bool parse_command_line(CLI::App& app, const std::vector<std::string>& args);

/// Runs `flashstep` with `args`; writes results to `out` and errors (one line
/// each, prefixed "flashstep: ") to `err`. Returns the process exit code:
/// 0 on success, 1 when a stage failed its check or could not run,
/// 2 on bad usage or input.
int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flashstep::cli
