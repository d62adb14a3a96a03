/// \file ring_cli.h
/// \brief The `flashstep_ring` command: ring attention of one sequence over
/// the visible GPUs (run), or its model per rank (model, no GPU needed).
/// CUDA-free; the run itself is in ring_run.cpp, which the command links
/// with the NCCL runner.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/stage.h"
#include "report.h"
#include "ring_schedule.h"

namespace flashstep::ring {

/// What `flashstep_ring` does.
enum class Mode {
  kRun,    ///< run, check and time ring attention on the GPUs
  kModel,  ///< print each rank's modelled communication, traffic and FLOPs
  kHelp,   ///< print usage
};

/// Parsed command line.
struct RingOptions {
  Mode mode = Mode::kRun;
  Problem problem;  ///< default B=1 H=8 N=16384 d=128, non-causal; Nq = Nk = N
  std::string stage = "07_tensor_core";  ///< the forward stage that computes the partials
  std::optional<DType> dtype;  ///< --dtype; unset: the stage's native type
  int gpus = 0;                ///< ranks; 0: every visible GPU (run), 2 (model)
  Assign assign = Assign::kZigzag;  ///< how chunks are dealt to the ranks
  bool overlap = true;         ///< false: each transfer before the compute (the contrast)
  int warmup = 2;              ///< untimed runs before timing
  int iterations = 10;         ///< timed runs; 0: run once, untimed
  bool check = true;           ///< compare with the fp64 reference
  std::uint64_t seed = 0;      ///< seed of the random inputs
  cli::Format format = cli::Format::kTable;
};

/// Ranks `model` assumes when --gpus is not given.
inline constexpr int kModelDefaultGpus = 2;

/// Parses arguments (without the program name). Throws flashstep::Error with
/// a one-line message on an unknown flag, a bad value, a problem the ring
/// cannot split (validate_ring), or a stage that cannot compute partials
/// (require_partial_stage).
RingOptions parse_ring_args(const std::vector<std::string>& args);

/// The usage text.
std::string ring_usage();

/// The stage `o.stage` names (an exact name, or a number that selects one
/// stage); throws flashstep::Error when it selects none or several.
const Stage& partial_stage(const RingOptions& o);

/// The problem as the stage runs it: o.problem in --dtype, or the stage's native type.
Problem typed_problem(const RingOptions& o, const Stage& stage);

/// `model`: one row per rank (its chunks, partials by kind, scores and its
/// share of the work, bytes sent and received, the HBM bytes and FLOPs of its
/// partials and merges), then the stage alone on the whole sequence on one
/// GPU; the title gives the critical path against the balanced ideal.
cli::Report model_report(const Problem& p, const Schedule& s, const Stage& stage);

/// The query-row step of the fp64 check (reference_forward_rows): every row
/// while heads * N * N * d stays within the reference's budget, else every
/// step-th row, the step capped so that each chunk still has two rows checked.
std::int64_t check_row_step(const Problem& p, const Schedule& s);

/// Runs `flashstep_ring` with `args` (ring_run.cpp); results to `out`,
/// errors (one line each, "flashstep_ring: ...") to `err`. Returns 0 on
/// success, 1 when the check failed or the ring could not run (no GPU, too
/// few GPUs, built without NCCL), 2 on bad usage.
int ring_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flashstep::ring
