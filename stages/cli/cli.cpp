#include "cli.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/npy.h"
#include "common/reference.h"
#include "common/stage.h"
#include "report.h"

namespace flashstep::cli {

namespace {

// The default problem: one attention layer of a small model, big enough to
// time (8 heads of 1024 x 1024 scores) and small enough for every stage.
constexpr std::int64_t kDefaultHeads = 8;
constexpr std::int64_t kDefaultSeqLen = 1024;
constexpr std::int64_t kDefaultHeadDim = 64;
// The fp64 reference checks every row while B*H*Nq*Nk*d stays under this many
// multiply-adds (about a second on one core); above it, every k-th row.
constexpr double kReferenceMacBudget = 4e8;
constexpr double kTera = 1e12;
// Upper bound on --warmup and --iters: a typo should not start a day-long run.
constexpr std::int64_t kMaxRepeats = 100000;
constexpr double kMsPerS = 1e3;

// Exit codes.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

std::int64_t parse_int(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw Error(flag + " expects an integer, got '" + value + "'");
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw Error(flag + " expects a number, got '" + value + "'");
  }
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) parts.push_back(item);
  return parts;
}

std::vector<const Stage*> selected_stages(const std::string& selectors) {
  std::vector<const Stage*> out;
  for (const std::string& sel : split(selectors, ',')) {
    for (const Stage* s : select_stages(sel)) {
      bool seen = false;
      for (const Stage* o : out) seen = seen || o == s;
      if (!seen) out.push_back(s);
    }
  }
  if (out.empty()) throw Error("--stage selects no stage");
  return out;
}

// Cells that place a row's problem in CSV and JSON (hidden in the text table).
const std::vector<std::string> kProblemColumns = {".B", ".H", ".Nq", ".Nk", ".d", ".causal"};

std::vector<Cell> problem_cells(const Problem& p) {
  return {integer(p.B), integer(p.H), integer(p.Nq), integer(p.Nk), integer(p.d),
          integer(p.causal ? 1 : 0)};
}

void append(std::vector<Cell>& row, const std::vector<Cell>& more) {
  row.insert(row.end(), more.begin(), more.end());
}

Report model_report(const Problem& p, const std::vector<const Stage*>& stages) {
  Report r;
  r.title = "model for " + p.describe();
  r.columns = {"stage", "HBM read", "HBM write", "SRAM read", "SRAM write", "matmul FLOPs",
               "other FLOPs", "blocks", "skipped tiles", "barriers"};
  r.columns.insert(r.columns.end(), kProblemColumns.begin(), kProblemColumns.end());
  for (const Stage* s : stages) {
    const Cost c = s->model(p);
    std::vector<Cell> row = {text(std::string(s->name)), bytes(c.hbm_read_bytes),
                             bytes(c.hbm_write_bytes), bytes(c.sram_read_bytes),
                             bytes(c.sram_write_bytes), flops(c.matmul_flops),
                             flops(c.nonmatmul_flops), integer(c.thread_blocks),
                             integer(c.skipped_tiles),
                             // Only stage 06 models its barriers; 0 means "not modelled".
                             c.barriers > 0 ? integer(c.barriers) : number(std::nan(""))};
    append(row, problem_cells(p));
    r.rows.push_back(row);
  }
  return r;
}

// Q, K, V read from DIR/{Q,K,V}.npy; the problem's sizes come from their shapes.
Inputs load_inputs(const std::string& dir, Problem& p, const std::set<std::string>& given) {
  const NpyArray q = read_npy(dir + "/Q.npy");
  const NpyArray k = read_npy(dir + "/K.npy");
  const NpyArray v = read_npy(dir + "/V.npy");
  for (const auto* a : {&q, &k, &v}) {
    if (a->shape.size() != 4) {
      throw Error(dir + ": Q, K and V must be 4-D [B, H, N, d]; got a " +
                  std::to_string(a->shape.size()) + "-D array");
    }
  }
  if (k.shape != v.shape) throw Error(dir + ": K.npy and V.npy shapes differ");
  if (q.shape[0] != k.shape[0] || q.shape[1] != k.shape[1] || q.shape[3] != k.shape[3]) {
    throw Error(dir + ": Q.npy [B, H, Nq, d] and K.npy [B, H, Nk, d] disagree on B, H or d");
  }
  const std::map<std::string, std::int64_t> from_files = {
      {"--B", q.shape[0]}, {"--H", q.shape[1]}, {"--Nq", q.shape[2]}, {"--Nk", k.shape[2]},
      {"--d", q.shape[3]}};
  const std::map<std::string, std::int64_t> from_flags = {
      {"--B", p.B}, {"--H", p.H}, {"--Nq", p.Nq}, {"--Nk", p.Nk}, {"--d", p.d}};
  for (const auto& [flag, value] : from_files) {
    if (given.count(flag) && from_flags.at(flag) != value) {
      throw Error(flag + " " + std::to_string(from_flags.at(flag)) + " contradicts the loaded " +
                  "files' " + std::to_string(value));
    }
  }
  p.B = q.shape[0];
  p.H = q.shape[1];
  p.Nq = q.shape[2];
  p.Nk = k.shape[2];
  p.d = q.shape[3];
  validate(p);
  return {q.data, k.data, v.data};
}

void save_inputs(const std::string& dir, const Problem& p, const Inputs& in) {
  std::filesystem::create_directories(dir);
  write_npy(dir + "/Q.npy", {p.B, p.H, p.Nq, p.d}, in.Q.data());
  write_npy(dir + "/K.npy", {p.B, p.H, p.Nk, p.d}, in.K.data());
  write_npy(dir + "/V.npy", {p.B, p.H, p.Nk, p.d}, in.V.data());
}

// One stage's row of the run table.
struct StageResult {
  std::string status = "error";  // ok, FAIL, error, unchecked
  std::optional<Comparison> o_check, l_check;
  Timing timing;
};

}  // namespace

std::string usage() {
  return R"(usage: flashstep [run|model] [options]

Runs every stage on one problem, checks it against the fp64 reference, times
it, and prints it beside its modelled HBM traffic. Without a GPU, prints the
model alone.

  run                 (default) run, check and time the stages on the GPU
  model               print each stage's modelled traffic and FLOPs; no GPU used

problem (default B=1 H=8 N=1024 d=64, non-causal, scale 1/sqrt(d)):
  --B N, --H N        batch and heads
  --N N               query and key length (sets --Nq and --Nk)
  --Nq N, --Nk N      query length, key length
  --d N               head dimension, 1..256
  --causal            bottom-right aligned causal mask
  --scale X           softmax scale
  --seed N            seed of the random inputs (default 0)
  --load DIR          read DIR/Q.npy, K.npy, V.npy (float32 [B,H,N,d]); sizes from the files

what to run and print:
  --stage S[,S...]    stage names or numbers (01, 3, 04_fa2_q_outer) or all (default)
  --warmup N          untimed runs before timing (default 3)
  --iters N           timed runs; median, p20, p80 reported (default 20);
                      0 runs each stage once, untimed (for profilers)
  --no-check          skip the fp64 reference check
  --format F          table (default), csv or json
  --save DIR          write Q, K, V and each stage's O_<stage>.npy, L_<stage>.npy
  -h, --help          this text
)";
}

Options parse_args(const std::vector<std::string>& args) {
  Options o;
  o.problem.H = kDefaultHeads;
  o.problem.Nq = o.problem.Nk = kDefaultSeqLen;
  o.problem.d = kDefaultHeadDim;
  for (size_t k = 0; k < args.size(); ++k) {
    std::string flag = args[k];
    std::optional<std::string> inline_value;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (k + 1 >= args.size()) throw Error(flag + " expects a value");
      return args[++k];
    };
    auto no_value = [&] {
      if (inline_value) throw Error(flag + " takes no value");
    };
    Problem& p = o.problem;
    if (k == 0 && flag == "run") o.mode = Mode::kRun;
    else if (k == 0 && flag == "model") o.mode = Mode::kModel;
    else if (flag == "-h" || flag == "--help") o.mode = Mode::kHelp;
    else if (flag == "--B") p.B = parse_int(flag, value());
    else if (flag == "--H") p.H = parse_int(flag, value());
    else if (flag == "--N") p.Nq = p.Nk = parse_int(flag, value());
    else if (flag == "--Nq") p.Nq = parse_int(flag, value());
    else if (flag == "--Nk") p.Nk = parse_int(flag, value());
    else if (flag == "--d") p.d = parse_int(flag, value());
    else if (flag == "--causal") { no_value(); p.causal = true; }
    else if (flag == "--scale") p.scale = parse_double(flag, value());
    else if (flag == "--seed") {
      const std::int64_t seed = parse_int(flag, value());
      if (seed < 0) throw Error("--seed must be >= 0");
      o.seed = static_cast<std::uint64_t>(seed);
    }
    else if (flag == "--stage") o.stages = value();
    else if (flag == "--warmup") {
      const std::int64_t w = parse_int(flag, value());
      if (w < 0 || w > kMaxRepeats) throw Error("--warmup must be in 0.." + std::to_string(kMaxRepeats));
      o.warmup = static_cast<int>(w);
    }
    else if (flag == "--iters") {
      const std::int64_t n = parse_int(flag, value());
      if (n < 0 || n > kMaxRepeats) throw Error("--iters must be in 0.." + std::to_string(kMaxRepeats));
      o.iterations = static_cast<int>(n);
    }
    else if (flag == "--no-check") { no_value(); o.check = false; }
    else if (flag == "--format") {
      const std::string f = value();
      if (f == "table") o.format = Format::kTable;
      else if (f == "csv") o.format = Format::kCsv;
      else if (f == "json") o.format = Format::kJson;
      else throw Error("--format must be table, csv or json, got '" + f + "'");
    }
    else if (flag == "--load") o.load_dir = value();
    else if (flag == "--save") o.save_dir = value();
    else throw Error("unknown argument '" + args[k] + "'");
    if (flag.rfind("--", 0) == 0) o.given.insert(flag);
  }
  validate(o.problem);
  selected_stages(o.stages);  // an unknown stage is a usage error, found before any work
  return o;
}

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Options o;
  Inputs in;
  try {
    o = parse_args(args);
    if (o.mode == Mode::kHelp) {
      out << usage();
      return kExitOk;
    }
    if (!o.load_dir.empty()) in = load_inputs(o.load_dir, o.problem, o.given);
  } catch (const Error& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitUsage;
  }
  const Problem& p = o.problem;
  const std::vector<const Stage*> stages = selected_stages(o.stages);

  std::string why;
  if (o.mode == Mode::kModel || !cuda_device_available(&why)) {
    if (o.mode == Mode::kRun) {
      err << "flashstep: no usable CUDA device (" << why
          << "); printing the modelled traffic only, no timings\n";
    }
    print(model_report(p, stages), o.format, out);
    return kExitOk;
  }

  try {
    if (o.load_dir.empty()) in = random_inputs(p, o.seed);
    if (!o.save_dir.empty()) save_inputs(o.save_dir, p, in);
  } catch (const Error& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitUsage;
  }
  std::optional<ReferenceResult> ref;
  if (o.check) {
    const double macs = static_cast<double>(p.heads()) * static_cast<double>(p.Nq) *
                        static_cast<double>(p.Nk) * static_cast<double>(p.d);
    const auto step = static_cast<std::int64_t>(std::ceil(macs / kReferenceMacBudget));
    err << "flashstep: fp64 reference"
        << (step > 1 ? " on every " + std::to_string(step) + "th query row" : std::string())
        << "...\n";
    ref = reference_forward_rows(p, in.Q.data(), in.K.data(), in.V.data(), std::max<std::int64_t>(step, 1));
  }

  const DeviceInfo dev = device_info();
  Report r;
  r.title = p.describe() + " on " + dev.name +
            "; TFLOP/s counts 4*B*H*Nq*Nk*d (halved if causal); HBM = modelled bytes";
  r.columns = {"stage", "check", "max err O", "max err L", "median ms", "p20 ms", "p80 ms",
               "TFLOP/s", "HBM read", "HBM write", "blocks"};
  r.columns.insert(r.columns.end(), kProblemColumns.begin(), kProblemColumns.end());
  r.columns.push_back(".gpu");
  bool all_ok = true;
  for (size_t k = 0; k < stages.size(); ++k) {
    const Stage& s = *stages[k];
    err << "flashstep: [" << k + 1 << "/" << stages.size() << "] " << s.name << "...\n";
    StageResult res;
    try {
      DeviceRun run(s, p, in.Q.data(), in.K.data(), in.V.data());
      std::vector<float> O, L;
      run.run(O, L);
      if (ref) {
        res.o_check = compare(O.data(), ref->O, kFp32Tolerance);
        if (s.writes_lse) res.l_check = compare(L.data(), ref->L, kFp32Tolerance);
        const bool ok = res.o_check->ok() && (!res.l_check || res.l_check->ok());
        res.status = ok ? "ok" : "FAIL";
        if (!ok) {
          err << "flashstep: " << s.name << " differs from the fp64 reference: O "
              << res.o_check->summary()
              << (res.l_check ? "; L " + res.l_check->summary() : std::string()) << "\n";
        }
      } else {
        res.status = "unchecked";
      }
      if (!o.save_dir.empty()) {
        write_npy(o.save_dir + "/O_" + std::string(s.name) + ".npy", {p.B, p.H, p.Nq, p.d}, O.data());
        if (s.writes_lse) {
          write_npy(o.save_dir + "/L_" + std::string(s.name) + ".npy", {p.B, p.H, p.Nq}, L.data());
        }
      }
      if (o.iterations > 0) res.timing = run.time(o.warmup, o.iterations);
    } catch (const Error& e) {
      err << "flashstep: " << s.name << ": " << e.what() << "\n";
      res.status = "error";
    }
    all_ok = all_ok && (res.status == "ok" || res.status == "unchecked");
    const Cost c = s.model(p);
    const bool timed = res.timing.iterations > 0;
    const double nan = std::nan("");
    std::vector<Cell> row = {
        text(std::string(s.name)), text(res.status),
        number(res.o_check ? res.o_check->max_abs_error : nan, 2),
        number(res.l_check ? res.l_check->max_abs_error : nan, 2),
        number(timed ? res.timing.median_ms : nan), number(timed ? res.timing.p20_ms : nan),
        number(timed ? res.timing.p80_ms : nan),
        number(timed ? p.forward_flops() / (res.timing.median_ms / kMsPerS) / kTera : nan, 3),
        bytes(c.hbm_read_bytes), bytes(c.hbm_write_bytes), integer(c.thread_blocks)};
    append(row, problem_cells(p));
    row.push_back(text(dev.name));
    r.rows.push_back(row);
  }
  print(r, o.format, out);
  return all_ok ? kExitOk : kExitFailed;
}

}  // namespace flashstep::cli
