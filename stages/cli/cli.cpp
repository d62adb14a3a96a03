#include "cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <ostream>
#include <utility>

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
// The reference gradients hold P, dP and dS of one head in double, Nq x Nk
// each, and have no row sampling: above these sizes the CLI leaves gradients
// unchecked (the tests check them) rather than take minutes and gigabytes.
constexpr double kReferenceGradMacBudget = 4e9;
constexpr double kReferenceGradHeadScores = 16.0 * 1024 * 1024;
// The backward's FLOPs by the FlashAttention convention: 2.5 x the forward's
// (five N x N x d products against two).
constexpr double kBackwardFlopFactor = 2.5;
constexpr double kTera = 1e12;
// Upper bound on --warmup and --iters: a typo should not start a day-long run.
constexpr std::int64_t kMaxRepeats = 100000;
constexpr double kMsPerS = 1e3;

// Exit codes.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Numbers as written, in base 10, with the flag's own message: std::from_chars,
// not CLI11's conversion. CLI11 2.1 (Debian 12's) reads an integer with
// strtoll in base 0, so "010" is 8 and "0x10" 16, and takes one past INT64_MAX
// as INT64_MAX without an error (stages/cli/README.md).
std::int64_t to_int(const std::string& flag, const std::string& value) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [rest, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || rest != end) {
    throw Error(flag + " expects an integer, got '" + value + "'");
  }
  return v;
}

double to_double(const std::string& flag, const std::string& value) {
  double v = 0;
  const char* end = value.data() + value.size();
  const auto [rest, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || rest != end) throw Error(flag + " expects a number, got '" + value + "'");
  return v;
}

std::vector<const Stage*> selected_stages(const std::vector<std::string>& selectors) {
  std::vector<const Stage*> out;
  for (const std::string& sel : selectors) {
    for (const Stage* s : select_stages(sel)) {
      bool seen = false;
      for (const Stage* o : out) seen = seen || o == s;
      if (!seen) out.push_back(s);
    }
  }
  if (out.empty()) throw Error("--stage selects no stage");
  return out;
}

// The element type stage s runs in: --dtype's, or its native (first) one.
DType run_dtype(const Stage& s, const std::optional<DType>& dtype) {
  return dtype ? *dtype : s.dtypes.front();
}

// The stages that run in --dtype (all of them without it); an Error naming
// the stages that do when none of the selected ones does.
std::vector<const Stage*> typed_stages(const std::vector<const Stage*>& stages,
                                       const std::optional<DType>& dtype);

// The stages among `stages` that run p's heads: all of them unless p is
// grouped (H_kv < H), then those with Stage::grouped_heads; an Error if none
// does, naming the stages that do.
std::vector<const Stage*> headed_stages(const std::vector<const Stage*>& stages, const Problem& p) {
  if (!p.grouped()) return stages;
  std::vector<const Stage*> out;
  for (const Stage* s : stages) {
    if (s->grouped_heads) out.push_back(s);
  }
  if (out.empty()) {
    std::string have;
    for (const Stage& s : all_stages()) {
      if (s.grouped_heads) have += (have.empty() ? "" : ", ") + std::string(s.name);
    }
    throw Error("--H-kv " + std::to_string(p.kv_heads()) + " < H: no selected stage runs " +
                "grouped-query attention (these do: " + (have.empty() ? std::string("none") : have) +
                ")");
  }
  return out;
}

std::vector<const Stage*> typed_stages(const std::vector<const Stage*>& stages,
                                       const std::optional<DType>& dtype) {
  if (!dtype) return stages;
  std::vector<const Stage*> out;
  for (const Stage* s : stages) {
    if (s->supports(*dtype)) out.push_back(s);
  }
  if (out.empty()) {
    std::string have;
    for (const Stage& s : all_stages()) {
      if (s.supports(*dtype)) have += (have.empty() ? "" : ", ") + std::string(s.name);
    }
    const std::string name(dtype_name(*dtype));
    throw Error("--dtype " + name + ": no selected stage runs in " + name + " (these do: " +
                (have.empty() ? std::string("none") : have) + ")");
  }
  return out;
}

// Cells that place a row's problem in CSV and JSON (hidden in the text table).
// H_kv is always written (H when --H-kv is not given): a grouped run's row
// must not read as the same problem as the ungrouped one.
const std::vector<std::string> kProblemColumns = {".B", ".H", ".H_kv", ".Nq", ".Nk", ".d",
                                                  ".causal"};

std::vector<Cell> problem_cells(const Problem& p) {
  return {integer(p.B), integer(p.H), integer(p.kv_heads()), integer(p.Nq), integer(p.Nk),
          integer(p.d), integer(p.causal ? 1 : 0)};
}

void append(std::vector<Cell>& row, const std::vector<Cell>& more) {
  row.insert(row.end(), more.begin(), more.end());
}

// CUDA encodes versions as 1000 * major + 10 * minor, e.g. 13000 for 13.0.
std::string cuda_version(int v) {
  constexpr int kMajor = 1000, kMinor = 10;
  return std::to_string(v / kMajor) + "." + std::to_string(v % kMajor / kMinor);
}

// `flashstep info`: one row of the device's facts.
Report info_report(const DeviceInfo& dev) {
  constexpr int kKhzPerMhz = 1000;
  Report r;
  r.title = "device 0";
  r.columns = {"gpu", "sm_count", "max_sm_clock_mhz", "max_mem_clock_mhz", "l2", "memory",
               "cuda_driver", "cuda_runtime"};
  r.rows.push_back({text(dev.name), integer(dev.sm_count), integer(dev.sm_clock_khz / kKhzPerMhz),
                    integer(dev.mem_clock_khz / kKhzPerMhz), bytes(dev.l2_bytes),
                    bytes(dev.total_bytes), text(cuda_version(dev.driver_version)),
                    text(cuda_version(dev.runtime_version))});
  return r;
}

// Whether --backward runs `s`'s backward on p in `t`: it has one in t and,
// when p is grouped (H_kv < H), it runs grouped heads (Stage::grouped_backward).
bool runs_backward(const Stage& s, DType t, const Problem& p) {
  return s.backward_supports(t) && (!p.grouped() || s.grouped_backward);
}

// The stages whose backward runs p in their type, for --backward; an Error if
// none does, naming the stages that have one (with --dtype, its types; on a
// grouped problem, those whose backward runs grouped heads).
std::vector<const Stage*> backward_stages(const std::vector<const Stage*>& stages,
                                          const std::optional<DType>& dtype, const Problem& p) {
  std::vector<const Stage*> out;
  for (const Stage* s : stages) {
    if (runs_backward(*s, run_dtype(*s, dtype), p)) out.push_back(s);
  }
  if (out.empty()) {
    std::string have;
    for (const Stage& s : all_stages()) {
      if (!s.backward || (p.grouped() && !s.grouped_backward)) continue;
      have += (have.empty() ? "" : ", ") + std::string(s.name);
      if (dtype) have += " (" + dtype_list(s.backward_dtypes) + ")";
    }
    if (have.empty()) have = "none";
    if (p.grouped()) {
      throw Error("--backward --H-kv " + std::to_string(p.kv_heads()) +
                  " < H: no selected stage's backward runs grouped-query attention (these do: " +
                  have + ")");
    }
    if (!dtype) {
      throw Error("--backward: no selected stage has a backward pass (these do: " + have + ")");
    }
    const std::string name(dtype_name(*dtype));
    throw Error("--backward --dtype " + name + ": no selected stage has a backward in " + name +
                " (these have one: " + have + ")");
  }
  return out;
}

Report model_report(const Problem& base, const std::vector<const Stage*>& stages, bool backward,
                    const std::optional<DType>& dtype) {
  Report r;
  r.title = (backward ? "backward model for " : "model for ") + base.describe();
  r.columns = {"stage", "dtype", "HBM read", "HBM write", "SRAM read", "SRAM write",
               "matmul FLOPs", "other FLOPs", "blocks", "skipped tiles", "barriers",
               "device memory"};
  r.columns.insert(r.columns.end(), kProblemColumns.begin(), kProblemColumns.end());
  for (const Stage* s : stages) {
    Problem p = base;
    p.dtype = run_dtype(*s, dtype);
    const Cost c = backward ? s->backward_model(p) : s->model(p);
    std::vector<Cell> row = {text(std::string(s->name)), text(std::string(dtype_name(p.dtype))),
                             bytes(c.hbm_read_bytes), bytes(c.hbm_write_bytes),
                             bytes(c.sram_read_bytes), bytes(c.sram_write_bytes),
                             flops(c.matmul_flops), flops(c.nonmatmul_flops),
                             integer(c.thread_blocks), integer(c.skipped_tiles),
                             // Stage 06 and stage 07's backward model their barriers;
                             // 0 means "not modelled".
                             c.barriers > 0 ? integer(c.barriers) : number(std::nan("")),
                             // What a run allocates: inputs, outputs, workspaces (and gradients).
                             bytes(device_bytes_needed(*s, p, backward))};
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
  // K and V have H_kv heads, H_kv = H or (grouped-query attention) a divisor of H.
  if (q.shape[0] != k.shape[0] || q.shape[3] != k.shape[3] || k.shape[1] < 1 ||
      q.shape[1] % k.shape[1] != 0) {
    throw Error(dir + ": Q.npy [B, H, Nq, d] and K.npy [B, H_kv, Nk, d] disagree on B or d, or " +
                "H is not a multiple of H_kv");
  }
  // Each size flag given beside --load must agree with the files (--N sets
  // both Nq and Nk, so it must agree with both).
  struct Size {
    std::string flag;
    std::int64_t from_flag, from_files;
  };
  const std::vector<Size> sizes = {
      {"--B", p.B, q.shape[0]},   {"--H", p.H, q.shape[1]},   {"--Nq", p.Nq, q.shape[2]},
      {"--Nk", p.Nk, k.shape[2]}, {"--N", p.Nq, q.shape[2]},  {"--N", p.Nk, k.shape[2]},
      {"--d", p.d, q.shape[3]},   {"--H-kv", p.kv_heads(), k.shape[1]}};
  for (const Size& size : sizes) {
    if (given.count(size.flag) && size.from_flag != size.from_files) {
      throw Error(size.flag + " " + std::to_string(size.from_flag) + " contradicts the loaded " +
                  "files' " + std::to_string(size.from_files));
    }
  }
  p.B = q.shape[0];
  p.H = q.shape[1];
  p.H_kv = k.shape[1];
  p.Nq = q.shape[2];
  p.Nk = k.shape[2];
  p.d = q.shape[3];
  validate(p);
  return {q.data, k.data, v.data};
}

// The file --save writes for `array` (Q, O, dQ, ...): ARRAY.npy for an input,
// ARRAY_<stage>.npy for a stage's output.
std::string saved_file(const std::string& dir, const std::string& array, const Stage* s = nullptr) {
  return dir + "/" + array + (s ? "_" + std::string(s->name) : std::string()) + ".npy";
}

// Refuses, before any work, a --save DIR that is not a folder (or cannot be
// one: a file on its path), or that holds a file this run would write, unless
// `overwrite`; never replaces what is not a regular file. Creates nothing.
void check_save_dir(const Options& o, const std::vector<const Stage*>& stages) {
  namespace fs = std::filesystem;
  const std::string& dir = o.save_dir;
  std::error_code ec;
  // The nearest part of the path that exists must be a folder.
  fs::path existing = dir;
  while (!fs::exists(fs::status(existing, ec)) && existing.has_relative_path()) {
    existing = existing.parent_path();
  }
  if (const fs::file_status st = fs::status(existing, ec); fs::exists(st) && !fs::is_directory(st)) {
    throw Error("--save " + dir + ": " + existing.string() + " is not a folder");
  }
  std::vector<std::string> files;
  for (const char* array : {"Q", "K", "V"}) files.push_back(saved_file(dir, array));
  if (o.backward) files.push_back(saved_file(dir, "dO"));
  for (const Stage* s : stages) {
    files.push_back(saved_file(dir, "O", s));
    if (s->writes_lse) files.push_back(saved_file(dir, "L", s));
    if (o.backward && runs_backward(*s, run_dtype(*s, o.dtype), o.problem)) {
      for (const char* grad : {"dQ", "dK", "dV"}) files.push_back(saved_file(dir, grad, s));
    }
  }
  for (const std::string& file : files) {
    const fs::file_status st = fs::symlink_status(file, ec);
    if (!fs::exists(st)) continue;
    if (!fs::is_regular_file(fs::status(file, ec))) {
      throw Error("--save: " + file + " exists and is not a regular file");
    }
    if (!o.overwrite) {
      throw Error("--save: " + file + " exists; pass --overwrite to replace it, or save elsewhere");
    }
  }
}

void save_inputs(const std::string& dir, const Problem& p, const Inputs& in) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("--save " + dir + ": cannot create the folder: " + ec.message());
  write_npy(saved_file(dir, "Q"), {p.B, p.H, p.Nq, p.d}, in.Q.data());
  write_npy(saved_file(dir, "K"), {p.B, p.kv_heads(), p.Nk, p.d}, in.K.data());
  write_npy(saved_file(dir, "V"), {p.B, p.kv_heads(), p.Nk, p.d}, in.V.data());
}

// One stage's row of the run table.
struct StageResult {
  std::string status = "error";  // ok, FAIL, error, unchecked, unavailable (not this GPU's)
  std::optional<ForwardCheck> check;
  Timing timing;
  std::string backward_status = "-";  // ok, FAIL, error, unchecked; "-" without a backward
  double grad_error = std::nan("");   // max abs error over dQ, dK and dV
  Timing backward_timing;
};

// Whether the fp64 reference gradients of `heads` heads of p are affordable
// (see the budgets).
bool gradients_checkable(const Problem& p, std::int64_t heads) {
  const double scores = static_cast<double>(p.Nq) * static_cast<double>(p.Nk);
  return scores <= kReferenceGradHeadScores &&
         static_cast<double>(heads) * scores * static_cast<double>(p.d) <= kReferenceGradMacBudget;
}

// The truth the gradients are checked against (common/check.h,
// BackwardTruth: the fp64 reference, and in 16 bits the naive backward in the
// type and the rule's floors), for the inputs rounded to p.dtype: all heads
// when affordable, else head 0 alone (heads are independent; on a grouped
// problem, head 0's group), else none. A head-0-only truth has that head's (or
// group's) elements; check_backward() then checks the first ones of each
// gradient. In 16 bits the naive backward reads O_read,
// the forward's O [B,H,Nq,d] that the stage's backward read (backward_truth
// says why; head 0 alone: its first Nq x d elements, batch 0 and head 0 as
// for the inputs), or its own O when O_read is null. Unused in fp32.
std::optional<BackwardTruth> reference_gradients(const Problem& p, const Inputs& in,
                                                 const std::vector<float>& dO,
                                                 const std::vector<float>* O_read,
                                                 std::ostream& err) {
  const std::string in_type =
      p.dtype == DType::kFp32
          ? std::string()
          : " from the inputs rounded to " + std::string(dtype_name(p.dtype)) +
                ", beside the naive backward in that type reading " +
                (O_read != nullptr ? "the stage's O" : "its own O") + ",";
  if (gradients_checkable(p, p.heads())) {
    err << "flashstep: fp64 reference gradients" << in_type << "...\n";
    return backward_truth(p, in, dO, O_read);
  }
  if (gradients_checkable(p, p.group())) {
    err << "flashstep: fp64 reference gradients" << in_type
        << (p.grouped() ? " of head 0's group only (all " : " of head 0 only (all ") << p.heads()
        << " heads pass the reference's budget)...\n";
    // K/V head 0's dK and dV sum over its group's query heads: the first
    // group's H / H_kv query heads, then, are the smallest problem to check.
    Problem one = p;
    one.B = 1;
    one.H = p.group();
    one.H_kv = 1;
    std::vector<float> O_head0;
    if (O_read != nullptr) O_head0.assign(O_read->begin(), O_read->begin() + one.q_elems());
    return backward_truth(one, in, dO, O_read != nullptr ? &O_head0 : nullptr);
  }
  err << "flashstep: gradients left unchecked: one head's fp64 reference backward (Nq x Nk "
         "doubles, no row sampling) passes its budget; the tests check the gradients\n";
  return std::nullopt;
}

// dO for --backward: DIR/dO.npy when --load gives a DIR holding one (it must
// match Q's shape), otherwise drawn from a seed of its own.
std::vector<float> load_or_draw_output_grad(const std::string& dir, const Problem& p,
                                            std::uint64_t seed) {
  // Any fixed odd constant keeps dO's stream apart from Q, K and V's.
  constexpr std::uint64_t kOutputGradSeedSalt = 0x9E3779B97F4A7C15ull;
  const std::string path = dir + "/dO.npy";
  std::error_code ec;  // anything there (a broken link too) is read, and read_npy says what is wrong
  if (dir.empty() || !std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    return random_output_grad(p, seed ^ kOutputGradSeedSalt);
  }
  const NpyArray g = read_npy(path);
  if (g.shape != std::vector<std::int64_t>{p.B, p.H, p.Nq, p.d}) {
    throw Error(path + ": dO must have Q's shape [B, H, Nq, d]");
  }
  return g.data;
}

// Compares the gradients with the reference (when there is one): "ok",
// "FAIL" (with a line on err), or "unchecked" (with a line saying why) when the
// reference is NaN wherever it was computed, from NaN or infinite inputs: a
// check of nothing is no pass. max_abs_error gets the worst of the three.
std::string check_gradients(const Stage& s, const Problem& p,
                            std::vector<const std::vector<float>*> got,
                            const std::optional<BackwardTruth>& ref, double& max_abs_error,
                            std::ostream& err) {
  if (!ref) return "unchecked";
  const char* names[] = {"dQ", "dK", "dV"};
  const BackwardCheck check = check_backward(p, got[0]->data(), got[1]->data(), got[2]->data(), *ref);
  const Comparison* comparisons[] = {&check.dQ.c, &check.dK.c, &check.dV.c};
  bool failed = false, unchecked = false;
  max_abs_error = 0.0;
  for (size_t k = 0; k < got.size(); ++k) {
    const Comparison& c = *comparisons[k];
    max_abs_error = std::max(max_abs_error, c.max_abs_error);
    if (c.checked == 0) {
      unchecked = true;
      err << "flashstep: " << s.name << " backward: " << names[k] << ": nothing to compare (the "
          << "reference is NaN everywhere: NaN or infinite inputs?); left unchecked\n";
    } else if (!c.ok()) {
      failed = true;
      err << "flashstep: " << s.name << " backward: " << names[k]
          << " differs from the fp64 reference: " << c.summary() << "\n";
    }
  }
  return failed ? "FAIL" : unchecked ? "unchecked" : "ok";
}

// Refuses, before the host allocates anything, a problem that no selected
// stage fits in the device's memory, or whose host arrays do not fit in this
// machine's: a problem within the contract can still be far too large.
void check_fits(const Problem& p, const std::vector<const Stage*>& stages, const Options& o) {
  const std::int64_t device = device_info().total_bytes;
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  for (const Stage* s : stages) {
    Problem ps = p;
    ps.dtype = run_dtype(*s, o.dtype);
    const bool backward = o.backward && runs_backward(*s, ps.dtype, p);
    least = std::min(least, device_bytes_needed(*s, ps, backward));
  }
  if (least > device) {
    throw Error(p.describe() + " needs " + bytes(least).pretty + " of device memory in every " +
                "selected stage, more than the device's " + bytes(device).pretty);
  }
  // In fp32 on the host whatever the type: Q, K, V and dO; one stage's O, L,
  // dQ, dK and dV; the reference's O and L in fp64.
  constexpr std::int64_t kFp64Bytes = 8;
  const std::int64_t grads = o.backward ? 2 * p.q_elems() + 2 * p.kv_elems() : 0;
  const std::int64_t host = (p.q_elems() + 2 * p.kv_elems() + p.q_elems() + p.lse_elems() + grads) *
                                kFloatBytes +
                            (o.check ? (p.q_elems() + p.lse_elems()) * kFp64Bytes : 0);
  const std::int64_t machine =
      static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::int64_t>(sysconf(_SC_PAGE_SIZE));
  if (host > machine) {
    throw Error(p.describe() + " needs " + bytes(host).pretty + " of host memory, more than this " +
                "machine's " + bytes(machine).pretty);
  }
}

}  // namespace

namespace {

// CLI11's help layout, with the usage line first, the modes before the
// options, one blank line between sections (CLI11 leaves two between option
// groups), and each option shown with its value's name alone (CLI11 adds
// " ..." to --stage, whose value it splits at commas).
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    std::string help = make_usage(app, name) + "\n" + make_description(app) +
                       make_subcommands(app, mode) + make_groups(app, mode);
    for (std::size_t at; (at = help.find("\n\n\n")) != std::string::npos;) help.erase(at, 1);
    return help;
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_type_size() == 0 ? std::string() : " " + opt->get_type_name();
  }
};

// The command line, as CLI11 reads it into `o`. The modes are subcommands
// whose options all live on the top level (fallthrough), so options go before
// or after the mode. Every option's callback checks its value and stores it in
// `o` as the option is read (trigger_on_parse): a later flag overrides an
// earlier one (--N 100 --Nk 50 gives Nq = 100, Nk = 50), and a bad value is
// reported as it is met, by the flashstep::Error the callback throws.
void define(CLI::App& app, Options& o) {
  constexpr std::size_t kNameColumn = 22;  // the descriptions start here
  app.formatter(std::make_shared<UsageFormatter>());
  app.get_formatter()->column_width(kNameColumn);
  app.get_formatter()->label("Usage", "usage");
  app.get_formatter()->label("OPTIONS", "options");
  app.get_formatter()->label("SUBCOMMAND", "run|model|info");
  // Left over arguments are reported after the parse, in flashstep's words.
  app.allow_extras();
  app.require_subcommand(0, 1);
  app.set_help_flag();  // added last, below, so it is listed last

  const std::string modes = "modes";
  for (const auto& [name, help] : std::vector<std::pair<std::string, std::string>>{
           {"run", "(default) run, check and time the stages on the GPU"},
           {"model", "print each stage's modelled traffic and FLOPs; no GPU used"},
           {"info", "print the GPU's name, SM count, clocks, memory, driver and\n"
                    "CUDA versions (what the benchmarks record beside results)"}}) {
    // Without a help flag of its own, a mode passes --help to the top level.
    app.add_subcommand(name, help)->group(modes)->fallthrough()->set_help_flag();
  }

  std::string group;  // the group of the options added next
  // An option with a value: `store` checks it and puts it in o.
  auto value = [&](const std::string& name, const std::string& type, const std::string& help,
                   std::function<void(const std::string&)> store) {
    app.add_option_function<std::string>(
           name,
           [&o, name, store](const std::string& v) {
             store(v);
             o.given.insert(name);
           },
           help)
        ->type_name(type)
        ->group(group)
        ->trigger_on_parse();
  };
  // A flag: no value, not even --flag=yes (CLI11 would read that as true).
  auto flag = [&](const std::string& name, const std::string& help, std::function<void()> set) {
    app.add_flag_callback(
           name,
           [&o, name, set] {
             set();
             o.given.insert(name);
           },
           help)
        ->check(CLI::Validator(
            [name](std::string& v) -> std::string {
              if (v != "true") throw Error(name + " takes no value");
              return {};
            },
            ""))
        ->group(group)
        ->trigger_on_parse();
  };
  auto count = [](const std::string& name, const std::string& v) -> int {
    const std::int64_t n = to_int(name, v);
    if (n < 0 || n > kMaxRepeats) throw Error(name + " must be in 0.." + std::to_string(kMaxRepeats));
    return static_cast<int>(n);
  };
  auto folder = [](const std::string& name, const std::string& v) {
    if (v.empty()) throw Error(name + " expects a folder, got ''");
    return v;
  };
  Problem& p = o.problem;

  group = "problem (default B=1 H=8 N=1024 d=64, non-causal, scale 1/sqrt(d))";
  value("--B", "N", "batch", [&p](const std::string& v) { p.B = to_int("--B", v); });
  value("--H", "N", "heads", [&p](const std::string& v) { p.H = to_int("--H", v); });
  value("--H-kv", "N",
        "K/V heads (grouped-query attention): H a multiple of it,\n"
        "query head h reads K/V head h / (H / H_kv); default H",
        [&p](const std::string& v) { p.H_kv = to_int("--H-kv", v); });
  value("--N", "N", "query and key length (sets --Nq and --Nk)",
        [&p](const std::string& v) { p.Nq = p.Nk = to_int("--N", v); });
  value("--Nq", "N", "query length", [&p](const std::string& v) { p.Nq = to_int("--Nq", v); });
  value("--Nk", "N", "key length", [&p](const std::string& v) { p.Nk = to_int("--Nk", v); });
  value("--d", "N", "head dimension, 1..256", [&p](const std::string& v) { p.d = to_int("--d", v); });
  flag("--causal",
       "causal mask aligned bottom-right: query i sees key j iff\n"
       "j <= i + Nk - Nq (PyTorch's is_causal is top-left: j <= i)",
       [&p] { p.causal = true; });
  value("--scale", "X", "softmax scale", [&p](const std::string& v) { p.scale = to_double("--scale", v); });
  value("--seed", "N", "seed of the random inputs (default 0)", [&o](const std::string& v) {
    const std::int64_t seed = to_int("--seed", v);
    if (seed < 0) throw Error("--seed must be >= 0");
    o.seed = static_cast<std::uint64_t>(seed);
  });
  value("--dtype", "T",
        "element type of Q, K, V and O: fp32, fp16 or bf16. Without\n"
        "it each stage runs in its own (first) type, fp32 for 01-06;\n"
        "with it, selected stages that lack T are skipped (a note\n"
        "says which). Inputs are drawn or loaded in fp32 and rounded\n"
        "to T on the way to the GPU; O is checked by FlashAttention's\n"
        "rule (at most twice the error of naive attention in T);\n"
        "L stays fp32",
        [&o](const std::string& t) {
          if (t != "fp32" && t != "fp16" && t != "bf16") {
            throw Error("--dtype must be fp32, fp16 or bf16, got '" + t + "'");
          }
          o.dtype = parse_dtype(t);
          o.problem.dtype = *o.dtype;
        });
  value("--load", "DIR",
        "read DIR/Q.npy, K.npy, V.npy ([B,H,N,d], float32 '<f4' or\n"
        "float16 '<f2', widened exactly); sizes from the files;\n"
        "with --backward also DIR/dO.npy when present",
        [&o, folder](const std::string& v) { o.load_dir = folder("--load", v); });

  group = "what to run and print";
  // Comma-separated, one argument per --stage (CLI11 splits it).
  app.add_option_function<std::vector<std::string>>(
         "--stage",
         [&o](const std::vector<std::string>& v) {
           o.stages = v;
           o.given.insert("--stage");
         },
         "stage names or numbers (01, 3, 04_fa2_q_outer) or all (default)")
      ->type_name("S[,S...]")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->group(group)
      ->trigger_on_parse();
  value("--warmup", "N", "untimed runs before timing (default 3)",
        [&o, count](const std::string& v) { o.warmup = count("--warmup", v); });
  value("--iters", "N",
        "timed runs; median, p20, p80 reported (default 20);\n"
        "0 runs each stage once, untimed (for profilers)",
        [&o, count](const std::string& v) { o.iterations = count("--iters", v); });
  flag("--backward",
       "also run, check and time the backward pass (stages that\n"
       "have one in their type), from the forward's O\n"
       "and L and a random dO; with model, print the backward's model",
       [&o] { o.backward = true; });
  flag("--no-check", "skip the fp64 reference check", [&o] { o.check = false; });
  value("--format", "F", "table (default), csv or json", [&o](const std::string& f) {
    if (f == "table") o.format = Format::kTable;
    else if (f == "csv") o.format = Format::kCsv;
    else if (f == "json") o.format = Format::kJson;
    else throw Error("--format must be table, csv or json, got '" + f + "'");
  });
  value("--save", "DIR",
        "write Q, K, V (fp32, as drawn or loaded) and each stage's\n"
        "O_<stage>.npy, L_<stage>.npy as float32, what the stage\n"
        "computed (with --backward also dO and dQ_, dK_, dV_<stage>.npy);\n"
        "needs a GPU; refuses to replace files already in DIR",
        [&o, folder](const std::string& v) { o.save_dir = folder("--save", v); });
  flag("--overwrite", "with --save: replace those files", [&o] { o.overwrite = true; });
  app.set_help_flag("-h,--help", "this text")->group(group);
}

const char* const kDescription =
    "Runs every stage on one problem, checks it against the fp64 reference, times\n"
    "it, and prints it beside its modelled HBM traffic. Without a GPU, prints the\n"
    "model alone.";

}  // namespace

std::string usage() {
  Options o;
  CLI::App app(kDescription, "flashstep");
  define(app, o);
  return app.help();
}

bool parse_command_line(CLI::App& app, const std::vector<std::string>& args) {
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes them reversed
  } catch (const CLI::CallForHelp&) {
    return false;
  } catch (const CLI::ArgumentMismatch&) {
    // The one mismatch these options can meet: the last argument is an
    // option that needs a value (as --N or --N=).
    const std::string& last = args.back();
    throw Error(last.substr(0, last.find('=')) + " expects a value");
  } catch (const CLI::ParseError& e) {
    throw Error(e.what());  // none expected; still one line
  }
  if (const std::vector<std::string> extra = app.remaining(true); !extra.empty()) {
    throw Error("unknown argument '" + extra.front() + "'");
  }
  return true;
}

Options parse_args(const std::vector<std::string>& args) {
  Options o;
  o.problem.H = kDefaultHeads;
  o.problem.Nq = o.problem.Nk = kDefaultSeqLen;
  o.problem.d = kDefaultHeadDim;
  CLI::App app(kDescription, "flashstep");
  define(app, o);
  if (!parse_command_line(app, args)) {
    o.mode = Mode::kHelp;
    return o;  // --help needs nothing else to be right
  }
  if (app.got_subcommand("model")) o.mode = Mode::kModel;
  if (app.got_subcommand("info")) o.mode = Mode::kInfo;
  validate(o.problem);
  // An unknown stage, a --dtype no selected stage runs in, and --backward with
  // no backward to run are usage errors, found before any work.
  const auto stages = headed_stages(typed_stages(selected_stages(o.stages), o.dtype), o.problem);
  if (!o.save_dir.empty() && o.mode != Mode::kRun) {
    throw Error("--save keeps a run's inputs and outputs; model and info run nothing to save");
  }
  if (o.overwrite && o.save_dir.empty()) throw Error("--overwrite goes with --save DIR");
  if (o.backward) backward_stages(stages, o.dtype, o.problem);
  return o;
}

namespace {

// run() without its last line of defence.
int execute(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Options o;
  Inputs in;
  try {
    o = parse_args(args);
    if (o.mode == Mode::kHelp) {
      out << usage();
      return kExitOk;
    }
    if (!o.load_dir.empty()) in = load_inputs(o.load_dir, o.problem, o.given);
    // Again: --load may have made the problem grouped.
    if (o.backward) backward_stages(selected_stages(o.stages), o.dtype, o.problem);
    if (!o.save_dir.empty()) {
      check_save_dir(o, typed_stages(selected_stages(o.stages), o.dtype));
    }
  } catch (const Error& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitUsage;
  }
  const Problem& p = o.problem;
  const std::vector<const Stage*> selected = selected_stages(o.stages);
  const std::vector<const Stage*> of_type = typed_stages(selected, o.dtype);
  std::vector<const Stage*> stages;
  try {
    stages = headed_stages(of_type, p);  // again: --load may have made p grouped
  } catch (const Error& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitUsage;
  }

  std::string why;
  if (o.mode == Mode::kInfo) {
    if (!cuda_device_available(&why)) {
      err << "flashstep: no usable CUDA device (" << why << ")\n";
      return kExitFailed;
    }
    print(info_report(device_info()), o.format, out);
    return kExitOk;
  }
  if (stages.size() < of_type.size()) {
    std::string skipped;
    for (const Stage* s : of_type) {
      if (!s->grouped_heads) skipped += (skipped.empty() ? "" : ", ") + std::string(s->name);
    }
    err << "flashstep: --H-kv " << p.kv_heads() << " < H: skipping " << skipped
        << " (no grouped-query kernel)\n";
  }
  if (of_type.size() < selected.size()) {
    std::string skipped;
    for (const Stage* s : selected) {
      if (!s->supports(*o.dtype)) skipped += (skipped.empty() ? "" : ", ") + std::string(s->name);
    }
    const std::string name(dtype_name(*o.dtype));
    err << "flashstep: --dtype " << name << ": skipping " << skipped << " (no " << name
        << " kernel)\n";
  }
  if (o.mode == Mode::kModel || !cuda_device_available(&why)) {
    if (o.mode == Mode::kRun && !o.save_dir.empty()) {
      err << "flashstep: no usable CUDA device (" << why << "); --save needs a run, nothing saved\n";
      return kExitFailed;
    }
    if (o.mode == Mode::kRun) {
      err << "flashstep: no usable CUDA device (" << why
          << "); printing the modelled traffic only, no timings\n";
    }
    print(model_report(p, o.backward ? backward_stages(stages, o.dtype, p) : stages, o.backward,
                       o.dtype),
          o.format, out);
    return kExitOk;
  }

  try {
    check_fits(p, stages, o);
  } catch (const Error& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitFailed;
  }
  std::vector<float> dO;  // [B, H, Nq, d], for --backward
  try {
    if (o.load_dir.empty()) in = random_inputs(p, o.seed);
    if (o.backward) dO = load_or_draw_output_grad(o.load_dir, p, o.seed);
    if (!o.save_dir.empty()) {
      save_inputs(o.save_dir, p, in);
      if (o.backward) write_npy(saved_file(o.save_dir, "dO"), {p.B, p.H, p.Nq, p.d}, dO.data());
    }
  } catch (const Error& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitUsage;
  }
  // What the forwards are checked against, per element type the stages run
  // in, each made when a stage first needs it: the fp64 reference (and in 16
  // bits the naive computation in the type) on every row while the problem is
  // small, else on every step-th query row.
  const std::int64_t step = reference_row_step(p);
  std::map<DType, ForwardTruth> truths;
  auto truth_for = [&](DType t) -> const ForwardTruth& {
    if (const auto it = truths.find(t); it != truths.end()) return it->second;
    const std::string name(dtype_name(t));
    err << "flashstep: fp64 reference"
        << (t == DType::kFp32 ? std::string()
                              : " from the inputs rounded to " + name + ", beside naive " + name +
                                    " attention,")
        << (step > 1 ? " on one query row in " + std::to_string(step) : std::string())
        << "...\n";
    Problem typed = p;
    typed.dtype = t;
    return truths.emplace(t, forward_truth(typed, in, step)).first->second;
  };
  // The gradients' truth in fp32 (the fp64 reference alone), made when first
  // needed and shared by the fp32 stages. In 16 bits each stage gets its own
  // (below): the naive backward there reads the O that stage's backward read.
  bool fp32_grad_truth_made = false;
  std::optional<BackwardTruth> fp32_grad_truth;
  auto fp32_grad_truth_for = [&]() -> const std::optional<BackwardTruth>& {
    if (!fp32_grad_truth_made) {
      Problem typed = p;
      typed.dtype = DType::kFp32;
      fp32_grad_truth = reference_gradients(typed, in, dO, nullptr, err);
      fp32_grad_truth_made = true;
    }
    return fp32_grad_truth;
  };

  const DeviceInfo dev = device_info();
  Report r;
  r.title = p.describe() + " on " + dev.name +
            "; TFLOP/s counts 4*B*H*Nq*Nk*d (halved if causal); HBM = modelled bytes";
  r.columns = {"stage", "dtype", "check", "max err O", "max err L", "median ms", "p20 ms",
               "p80 ms", "TFLOP/s", "HBM read", "HBM write", "blocks"};
  if (o.backward) {
    r.title += "; backward TFLOP/s counts 2.5x the forward's FLOPs";
    r.columns.insert(r.columns.end(),
                     {"bwd check", "max err dQKV", "bwd median ms", "bwd p20 ms", "bwd p80 ms",
                      "bwd TFLOP/s", "bwd HBM read", "bwd HBM write", "bwd memory"});
  }
  r.columns.insert(r.columns.end(), kProblemColumns.begin(), kProblemColumns.end());
  r.columns.push_back(".gpu");
  bool all_ok = true;
  for (size_t k = 0; k < stages.size(); ++k) {
    const Stage& s = *stages[k];
    err << "flashstep: [" << k + 1 << "/" << stages.size() << "] " << s.name << "...\n";
    StageResult res;
    Problem ps = p;
    ps.dtype = run_dtype(s, o.dtype);
    const bool backward = o.backward && runs_backward(s, ps.dtype, p);
    if (std::string unavailable; !stage_available(s, &unavailable)) {
      // Not this GPU's stage (an sm_90a one elsewhere): one line, not a failure.
      err << "flashstep: " << unavailable << "\n";
      res.status = "unavailable";
    } else try {
      DeviceRun run(s, ps, in.Q.data(), in.K.data(), in.V.data(), backward ? dO.data() : nullptr);
      std::vector<float> O, L;
      run.run(O, L);
      res.status = "unchecked";
      if (o.check) {
        res.check = check_forward(ps, O.data(), s.writes_lse ? L.data() : nullptr,
                                  truth_for(ps.dtype));
        if (res.check->ok()) {
          res.status = "ok";
        } else if (res.check->O.checked == 0) {
          err << "flashstep: " << s.name << ": nothing to compare (the reference is NaN on "
              << "every row checked: NaN or infinite inputs?); left unchecked\n";
        } else {
          res.status = "FAIL";
          err << "flashstep: " << s.name << " (" << dtype_name(ps.dtype)
              << ") differs from the fp64 reference: " << res.check->summary() << "\n";
        }
      }
      if (!o.save_dir.empty()) {
        write_npy(saved_file(o.save_dir, "O", &s), {p.B, p.H, p.Nq, p.d}, O.data());
        if (s.writes_lse) write_npy(saved_file(o.save_dir, "L", &s), {p.B, p.H, p.Nq}, L.data());
      }
      if (o.iterations > 0) res.timing = run.time(o.warmup, o.iterations);
      if (backward) {
        res.backward_status = "error";
        std::vector<float> dQ, dK, dV;
        run.run_backward(dQ, dK, dV, &O);  // O: now the forward's that the backward read
        if (!o.check) {
          res.backward_status = "unchecked";
        } else if (ps.dtype == DType::kFp32) {
          res.backward_status = check_gradients(s, ps, {&dQ, &dK, &dV}, fp32_grad_truth_for(),
                                                res.grad_error, err);
        } else {
          // The naive reads this stage's O when its forward's O passed the
          // check (backward_truth checks it again, on every row it uses, and
          // throws if it fails); else its own: the run already fails on the
          // forward, or the reference is NaN and nothing is compared.
          const bool O_passed = res.check && res.check->O.ok();
          const std::optional<BackwardTruth> truth =
              reference_gradients(ps, in, dO, O_passed ? &O : nullptr, err);
          res.backward_status =
              check_gradients(s, ps, {&dQ, &dK, &dV}, truth, res.grad_error, err);
        }
        if (!o.save_dir.empty()) {
          write_npy(saved_file(o.save_dir, "dQ", &s), {p.B, p.H, p.Nq, p.d}, dQ.data());
          write_npy(saved_file(o.save_dir, "dK", &s), {p.B, p.kv_heads(), p.Nk, p.d}, dK.data());
          write_npy(saved_file(o.save_dir, "dV", &s), {p.B, p.kv_heads(), p.Nk, p.d}, dV.data());
        }
        if (o.iterations > 0) res.backward_timing = run.time_backward(o.warmup, o.iterations);
      }
    } catch (const std::exception& e) {  // an Error, or host memory running out
      err << "flashstep: " << s.name << ": " << e.what() << "\n";
      // An error in the backward's run or timing fails the backward; any
      // earlier one, the forward.
      (res.backward_status == "-" ? res.status : res.backward_status) = "error";
    }
    all_ok = all_ok && (res.status == "ok" || res.status == "unchecked" ||
                        res.status == "unavailable") &&
             (res.backward_status == "-" || res.backward_status == "ok" ||
              res.backward_status == "unchecked");
    const Cost c = s.model(ps);
    const bool timed = res.timing.iterations > 0;
    const double nan = std::nan("");
    const bool l_checked = res.check && res.check->L;
    std::vector<Cell> row = {
        text(std::string(s.name)), text(std::string(dtype_name(ps.dtype))), text(res.status),
        number(res.check ? res.check->O.max_abs_error : nan, 2),
        number(l_checked ? res.check->L->max_abs_error : nan, 2),
        number(timed ? res.timing.median_ms : nan), number(timed ? res.timing.p20_ms : nan),
        number(timed ? res.timing.p80_ms : nan),
        number(timed ? p.forward_flops() / (res.timing.median_ms / kMsPerS) / kTera : nan, 3),
        bytes(c.hbm_read_bytes), bytes(c.hbm_write_bytes), integer(c.thread_blocks)};
    if (o.backward) {
      const bool bwd_timed = res.backward_timing.iterations > 0;
      const double bwd_ms = res.backward_timing.median_ms;
      const double bwd_flops = kBackwardFlopFactor * p.forward_flops();
      const Cost b = backward ? s.backward_model(ps) : Cost{};
      append(row, {text(res.backward_status), number(res.grad_error, 2),
                   number(bwd_timed ? bwd_ms : nan), number(bwd_timed ? res.backward_timing.p20_ms : nan),
                   number(bwd_timed ? res.backward_timing.p80_ms : nan),
                   number(bwd_timed ? bwd_flops / (bwd_ms / kMsPerS) / kTera : nan, 3),
                   backward ? bytes(b.hbm_read_bytes) : number(nan),
                   backward ? bytes(b.hbm_write_bytes) : number(nan),
                   backward ? bytes(device_bytes_needed(s, ps, true)) : number(nan)});
    }
    append(row, problem_cells(p));
    row.push_back(text(dev.name));
    r.rows.push_back(row);
  }
  print(r, o.format, out);
  return all_ok ? kExitOk : kExitFailed;
}

}  // namespace

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  // Whatever a user can cause ends in one line and a non-zero exit, never in
  // std::terminate: host memory running out, a filesystem error, or a flaw of
  // ours that lets something other than an Error escape.
  int code = kExitFailed;
  try {
    code = execute(args, out, err);
  } catch (const std::bad_alloc&) {
    err << "flashstep: out of host memory\n";
    return kExitFailed;
  } catch (const std::exception& e) {
    err << "flashstep: " << e.what() << "\n";
    return kExitFailed;
  }
  // Results that never reached their destination (a full disk, a closed
  // stdout) are a failure, not an exit 0.
  if (!out.flush()) {
    err << "flashstep: writing the output failed; it is missing or incomplete\n";
    return kExitFailed;
  }
  return code;
}

}  // namespace flashstep::cli
