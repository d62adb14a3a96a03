// The flashstep_ring command's parsing, usage and model (ring_cli.h).
// CLI11 reads the command line as in the flashstep command
// (stages/cli/README.md): numbers through std::from_chars, every user error
// one flashstep::Error line.
#include "ring_cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <functional>
#include <sstream>
#include <string>
#include <utility>

#include "cli.h"
#include "common/check.h"
#include "common/error.h"
#include "ring_model.h"

namespace flashstep::ring {

namespace {

// The default problem: one long sequence of a small model's attention layer,
// long enough that each of two GPUs gets 8k tokens.
constexpr std::int64_t kDefaultHeads = 8;
constexpr std::int64_t kDefaultSeqLen = 16384;
constexpr std::int64_t kDefaultHeadDim = 128;
// Upper bounds: a typo should not start a day-long run or ask for a ring of
// a million GPUs.
constexpr std::int64_t kMaxRepeats = 100000;
constexpr std::int64_t kMaxGpus = 1024;
// Rows of each chunk the fp64 check covers at least, however long N.
constexpr std::int64_t kCheckedRowsPerChunk = 2;

std::int64_t to_int(const std::string& flag, const std::string& value) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [rest, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || rest != end) throw Error(flag + " expects an integer, got '" + value + "'");
  return v;
}

double to_double(const std::string& flag, const std::string& value) {
  double v = 0;
  const char* end = value.data() + value.size();
  const auto [rest, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || rest != end) throw Error(flag + " expects a number, got '" + value + "'");
  return v;
}

std::string join(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

const char* const kDescription =
    "Ring attention (context parallelism) over NCCL: the sequence is cut into\n"
    "chunks spread over the GPUs, K/V chunks pass around the ring while each GPU\n"
    "attends its queries to them with a registered forward stage, and the\n"
    "partials are merged by their logsumexp. Checks against the fp64 reference,\n"
    "prints time, TFLOP/s, bytes sent per GPU and the share of communication\n"
    "hidden behind compute. `model` prints the per-GPU model, no GPU needed.";

// The command line, as CLI11 reads it into `o` (modes are subcommands whose
// options live on the top level, each option's callback checks and stores
// its value as it is read).
void define(CLI::App& app, RingOptions& o) {
  constexpr std::size_t kNameColumn = 22;
  app.get_formatter()->column_width(kNameColumn);
  app.allow_extras();
  app.require_subcommand(0, 1);
  for (const auto& [name, help] : std::vector<std::pair<std::string, std::string>>{
           {"run", "(default) run, check and time the ring on the GPUs"},
           {"model", "print each GPU's modelled communication, traffic and FLOPs"}}) {
    app.add_subcommand(name, help)->fallthrough()->set_help_flag();
  }
  auto value = [&](const std::string& name, const std::string& type, const std::string& help,
                   std::function<void(const std::string&)> store) {
    app.add_option_function<std::string>(name, store, help)->type_name(type)->trigger_on_parse();
  };
  auto flag = [&](const std::string& name, const std::string& help, std::function<void()> set) {
    app.add_flag_callback(name, set, help)
        ->check(CLI::Validator(
            [name](std::string& v) -> std::string {
              if (v != "true") throw Error(name + " takes no value");
              return {};
            },
            ""))
        ->trigger_on_parse();
  };
  auto count = [](const std::string& name, const std::string& v) -> int {
    const std::int64_t n = to_int(name, v);
    if (n < 0 || n > kMaxRepeats) throw Error(name + " must be in 0.." + std::to_string(kMaxRepeats));
    return static_cast<int>(n);
  };
  Problem& p = o.problem;
  value("--B", "N", "batch (default 1)", [&p](const std::string& v) { p.B = to_int("--B", v); });
  value("--H", "N", "heads (default 8)", [&p](const std::string& v) { p.H = to_int("--H", v); });
  value("--N", "N", "sequence length: queries and keys (default 16384)",
        [&p](const std::string& v) { p.Nq = p.Nk = to_int("--N", v); });
  value("--d", "N", "head dimension, 1..256 (default 128)",
        [&p](const std::string& v) { p.d = to_int("--d", v); });
  flag("--causal", "causal mask (query i sees key j iff j <= i)", [&p] { p.causal = true; });
  value("--scale", "X", "softmax scale (default 1/sqrt(d))",
        [&p](const std::string& v) { p.scale = to_double("--scale", v); });
  value("--seed", "N", "seed of the random inputs (default 0)", [&o](const std::string& v) {
    const std::int64_t seed = to_int("--seed", v);
    if (seed < 0) throw Error("--seed must be >= 0");
    o.seed = static_cast<std::uint64_t>(seed);
  });
  value("--dtype", "T", "fp32, fp16 or bf16 (default: the stage's own type)",
        [&o](const std::string& t) {
          if (t != "fp32" && t != "fp16" && t != "bf16") {
            throw Error("--dtype must be fp32, fp16 or bf16, got '" + t + "'");
          }
          o.dtype = parse_dtype(t);
        });
  value("--stage", "S",
        "the forward stage that computes each partial; it must write L\n"
        "(default 07_tensor_core, bf16; 05 or 06_warp_split_q in fp32)",
        [&o](const std::string& v) { o.stage = v; });
  value("--gpus", "P", "GPUs in the ring (default: every visible one; model: 2)",
        [&o](const std::string& v) {
          const std::int64_t n = to_int("--gpus", v);
          if (n < 1 || n > kMaxGpus) throw Error("--gpus must be in 1.." + std::to_string(kMaxGpus));
          o.gpus = static_cast<int>(n);
        });
  value("--assign", "A",
        "how chunks are dealt: zigzag (default: GPU r holds chunks r\n"
        "and 2P-1-r of 2P, balancing causal work) or contiguous",
        [&o](const std::string& v) { o.assign = parse_assign(v); });
  flag("--no-overlap", "each step's transfer before its compute, not beside it",
       [&o] { o.overlap = false; });
  value("--warmup", "N", "untimed runs before timing (default 2)",
        [&o, count](const std::string& v) { o.warmup = count("--warmup", v); });
  value("--iters", "N", "timed runs (default 10); 0 runs once, untimed",
        [&o, count](const std::string& v) { o.iterations = count("--iters", v); });
  flag("--no-check", "skip the fp64 reference check", [&o] { o.check = false; });
  value("--format", "F", "table (default), csv or json", [&o](const std::string& f) {
    if (f == "table") o.format = cli::Format::kTable;
    else if (f == "csv") o.format = cli::Format::kCsv;
    else if (f == "json") o.format = cli::Format::kJson;
    else throw Error("--format must be table, csv or json, got '" + f + "'");
  });
}

}  // namespace

std::string ring_usage() {
  RingOptions o;
  CLI::App app(kDescription, "flashstep_ring");
  define(app, o);
  return app.help();
}

RingOptions parse_ring_args(const std::vector<std::string>& args) {
  RingOptions o;
  o.problem.H = kDefaultHeads;
  o.problem.Nq = o.problem.Nk = kDefaultSeqLen;
  o.problem.d = kDefaultHeadDim;
  CLI::App app(kDescription, "flashstep_ring");
  define(app, o);
  if (!cli::parse_command_line(app, args)) {  // flashstep's parse, messages and all
    o.mode = Mode::kHelp;
    return o;
  }
  if (app.got_subcommand("model")) o.mode = Mode::kModel;
  if (o.mode == Mode::kModel && o.gpus == 0) o.gpus = kModelDefaultGpus;
  const Stage& stage = partial_stage(o);
  const Problem p = typed_problem(o, stage);
  validate_ring(p);
  require_partial_stage(stage, p);
  return o;
}

const Stage& partial_stage(const RingOptions& o) {
  const std::vector<const Stage*> hit = select_stages(o.stage);
  if (hit.size() > 1) {
    std::string names;
    for (const Stage* s : hit) names += (names.empty() ? "" : ", ") + std::string(s->name);
    throw Error("--stage " + o.stage + " selects " + std::to_string(hit.size()) +
                " stages; name one (" + names + ")");
  }
  return *hit.front();
}

Problem typed_problem(const RingOptions& o, const Stage& stage) {
  Problem p = o.problem;
  p.dtype = o.dtype ? *o.dtype : stage.dtypes.front();
  return p;
}

cli::Report model_report(const Problem& p, const Schedule& s, const Stage& stage) {
  using namespace cli;
  const std::vector<RankCost> ranks = ring_cost(p, s, stage);
  std::int64_t total_scores = 0;
  for (const RankCost& r : ranks) total_scores += r.scores;
  const double mean_scores = static_cast<double>(total_scores) / s.ranks();
  const double critical = static_cast<double>(s.critical_path_scores());
  Report r;
  std::ostringstream title;
  title.precision(3);
  title << "ring model for " << p.describe() << " on " << s.ranks() << " GPUs, "
        << assign_name(s.assign()) << ", partials by " << stage.name
        << "; critical path " << (mean_scores > 0 ? critical / mean_scores : 0.0)
        << "x the balanced ideal";
  r.title = title.str();
  r.columns = {"rank", "chunks", "rows", "full", "diagonal", "skipped", "scores", "work share",
               "sent", "received", "HBM read", "HBM write", "matmul FLOPs"};
  for (int k = 0; k < s.ranks(); ++k) {
    const RankCost& c = ranks[static_cast<size_t>(k)];
    r.rows.push_back({integer(k), text(join(s.held(k))), integer(s.rows_held(k)), integer(c.full),
                      integer(c.diagonal), integer(c.skipped), integer(c.scores),
                      number(mean_scores > 0 ? static_cast<double>(c.scores) / mean_scores : 0.0, 3),
                      bytes(c.bytes_sent), bytes(c.bytes_received),
                      bytes(c.compute.hbm_read_bytes), bytes(c.compute.hbm_write_bytes),
                      flops(c.compute.matmul_flops)});
  }
  // The same stage on the whole sequence, on one GPU: what the ring divides.
  const Cost alone = stage.model(p);
  r.rows.push_back({text("1 GPU"), text("all"), integer(p.Nq), integer(p.causal ? 0 : 1),
                    integer(p.causal ? 1 : 0), integer(0),
                    integer(p.causal ? p.Nq * (p.Nq + 1) / 2 : p.Nq * p.Nq),
                    number(std::nan("")), bytes(0), bytes(0), bytes(alone.hbm_read_bytes),
                    bytes(alone.hbm_write_bytes), flops(alone.matmul_flops)});
  return r;
}

std::int64_t check_row_step(const Problem& p, const Schedule& s) {
  const std::int64_t budget_step = reference_row_step(p);  // as flashstep checks
  const std::int64_t smallest_chunk = s.chunk(0).size();  // sizes grow with the index
  return std::clamp<std::int64_t>(smallest_chunk / kCheckedRowsPerChunk, 1, budget_step);
}

}  // namespace flashstep::ring
