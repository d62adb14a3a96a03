// flashstep_grade: grades one registered stage (a student's, or any) the way
// the shared tests check the project's stages, and says in words which part of
// the contract it breaks.
//
//   flashstep_grade --stage=99_yours [--mode=cpu|gpu|all] [--reference=04]
//                   [--backward] [--json=report.json] [--iters=20]
//
//   cpu  the stage's CPU mirror on the shared ragged grid (tests/shapes.h),
//        causal and not, against the fp64 reference; its counts against its model
//   gpu  the kernel on the same grid (outputs poisoned first), and its time
//        beside the reference stage's on the default problem
//
// With --backward the same for the stage's backward pass: its backward mirror
// and backward kernel, from the fp64 forward's O and L and a random dO, give
// dQ, dK, dV checked against the fp64 gradients (kFp32GradTolerance); each
// failure names the gradient, the rows and the likely cause.
//
// Exit: 0 every graded check passed; 1 something failed; 2 bad usage;
// 77 nothing could be graded (--mode=gpu without a GPU, --mode=cpu without a mirror).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/reference.h"
#include "common/stage.h"
#include "../shapes.h"

using namespace flashstep;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitSkip = 77;
// The bits the device runs poison O and L with (memset 0xFF), and the mirror
// runs here too: a NaN no arithmetic produces, so it means "never written".
constexpr std::uint32_t kPoisonBits = 0xFFFFFFFFu;

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return "\"" + o + "\"";
}

std::string num(double x) {
  if (std::isnan(x)) return "null";
  if (std::isinf(x)) return x > 0 ? "1e999" : "-1e999";
  std::ostringstream s;
  s.precision(6);
  s << x;
  return s.str();
}

bool is_poison(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b == kPoisonBits;
}

void poison(std::vector<float>& v, std::int64_t n) {
  float x;
  std::memcpy(&x, &kPoisonBits, sizeof x);
  v.assign(static_cast<size_t>(n), x);
}

// One checked problem.
struct Case {
  std::string problem;
  bool causal = false;
  bool pass = true;
  double o_err = 0, l_err = NAN;  // worst abs error
  bool backward = false;          // a backward case: the three below, not O and L
  double dq_err = NAN, dk_err = NAN, dv_err = NAN;
  std::vector<std::string> problems;  // what broke, in words
  std::vector<std::string> count_mismatches;  // "hbm_read_bytes: counted X, model Y"
};

// Element (b, h, i, k) of a [B, H, Nq, d] (k < 0: of L [B, H, Nq]).
std::string where(const Problem& p, std::int64_t e, bool is_L) {
  const std::int64_t d = is_L ? 1 : p.d;
  const std::int64_t k = e % d, i = (e / d) % p.Nq, h = (e / d / p.Nq) % p.H,
                     b = e / d / p.Nq / p.H;
  std::ostringstream s;
  s << (is_L ? "L[" : "O[") << b << "," << h << "," << i;
  if (!is_L) s << "," << k;
  s << "]";
  return s.str();
}

// Checks one run's O and L against the reference and the contract's rules.
Case check_outputs(const Stage& s, const Problem& p, const std::vector<float>& O,
                   const std::vector<float>& L, const ReferenceResult& ref) {
  Case c;
  c.problem = p.describe();
  c.causal = p.causal;
  auto fail = [&](const std::string& why) {
    c.pass = false;
    if (c.problems.size() < 8) c.problems.push_back(why);
  };
  // Unwritten elements and NaN first: they explain everything after them.
  for (int which = 0; which < (s.writes_lse ? 2 : 1); ++which) {
    const std::vector<float>& v = which ? L : O;
    std::int64_t unwritten = 0, nans = 0, first_unwritten = -1, first_nan = -1;
    for (std::int64_t e = 0; e < static_cast<std::int64_t>(v.size()); ++e) {
      if (is_poison(v[e])) {
        if (unwritten++ == 0) first_unwritten = e;
      } else if (std::isnan(v[e])) {
        if (nans++ == 0) first_nan = e;
      }
    }
    const char* name = which ? "L" : "O";
    if (unwritten) {
      fail(std::to_string(unwritten) + " of " + std::to_string(v.size()) + " elements of " + name +
           " were never written (still the poison), first " + where(p, first_unwritten, which) +
           ": every element of the output must be stored; look at the ragged tail (a last "
           "block smaller than the tile) and at rows that see no key");
    }
    if (nans) {
      fail(std::to_string(nans) + " elements of " + name + " are NaN, first " +
           where(p, first_nan, which) +
           ": a NaN was computed; typically exp(-inf - (-inf)) in a row or tile that sees no "
           "key yet (subtract 0 when the running max is -inf), or 0/0 when l = 0");
    }
  }
  // Rows that see no key: O = 0 and L = -inf exactly.
  std::int64_t bad_empty = 0;
  std::string first_empty;
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const std::int64_t row = bh * p.Nq + i;
      const bool empty = p.visible_keys(i) == 0;
      bool bad = false;
      if (empty) {
        for (std::int64_t k = 0; k < p.d; ++k) bad = bad || O[row * p.d + k] != 0.0f;
        if (s.writes_lse) bad = bad || L[row] != -INFINITY;
      } else if (s.writes_lse && L[row] == -INFINITY) {
        fail("L = -inf at " + where(p, row, true) + ", a row that sees " +
             std::to_string(p.visible_keys(i)) +
             " keys: l stayed 0 (was the running sum ever updated?)");
        break;
      }
      if (bad && bad_empty++ == 0) first_empty = where(p, row * p.d, false);
    }
  }
  if (bad_empty) {
    fail(std::to_string(bad_empty) + " rows that see no key (causal, Nq > Nk) are not O = 0" +
         (s.writes_lse ? std::string(", L = -inf") : std::string()) + ", first row of " +
         first_empty + ": the contract gives such a row O = 0 and L = -inf, never NaN");
  }
  const Comparison o = compare(O.data(), ref.O, kFp32Tolerance);
  c.o_err = o.max_abs_error;
  if (!o.ok()) fail("O differs from the fp64 reference: " + o.summary());
  if (s.writes_lse) {
    const Comparison l = compare(L.data(), ref.L, kFp32Tolerance);
    c.l_err = l.max_abs_error;
    if (!l.ok()) {
      fail("L differs from the fp64 reference (L = m + log l per row, natural log, scaled "
           "scores): " + l.summary());
    }
  }
  return c;
}

void compare_counts(const Cost& counted, const Cost& model, Case& c) {
  const std::pair<const char*, std::int64_t Cost::*> fields[] = {
      {"hbm_read_bytes", &Cost::hbm_read_bytes},   {"hbm_write_bytes", &Cost::hbm_write_bytes},
      {"sram_read_bytes", &Cost::sram_read_bytes}, {"sram_write_bytes", &Cost::sram_write_bytes},
      {"matmul_flops", &Cost::matmul_flops},       {"nonmatmul_flops", &Cost::nonmatmul_flops},
      {"thread_blocks", &Cost::thread_blocks},     {"skipped_tiles", &Cost::skipped_tiles},
      {"barriers", &Cost::barriers}};
  for (const auto& [name, field] : fields) {
    if (counted.*field != model.*field) {
      c.count_mismatches.push_back(std::string(name) + ": mirror counted " +
                                   std::to_string(counted.*field) + ", model says " +
                                   std::to_string(model.*field));
    }
  }
  if (!c.count_mismatches.empty()) {
    c.pass = false;
    c.problems.push_back("the mirror's counts differ from model(): " + c.count_mismatches[0] +
                         (c.count_mismatches.size() > 1
                              ? " (and " + std::to_string(c.count_mismatches.size() - 1) + " more)"
                              : std::string()) +
                         "; the mirror must move and compute exactly what the model says");
  }
}

// (b, h, i) of element e of a [B, H, N, d] gradient with N rows per head.
std::string grad_where(const Problem& p, const char* name, std::int64_t e, std::int64_t rows) {
  const std::int64_t i = (e / p.d) % rows, h = (e / p.d / rows) % p.H, b = e / p.d / rows / p.H;
  std::ostringstream s;
  s << name << "[" << b << "," << h << "," << i << "," << e % p.d << "]";
  return s.str();
}

// "rows 96..111 of head (0,1)": the first head with a bad element, and the run
// of rows from its first to its last bad row.
std::string bad_rows(const Problem& p, const std::vector<float>& got, const std::vector<double>& want,
                     std::int64_t rows) {
  const double atol = kFp32GradTolerance.atol, rtol = kFp32GradTolerance.rtol;
  std::int64_t head = -1, first = -1, last = -1;
  for (std::int64_t e = 0; e < static_cast<std::int64_t>(got.size()); ++e) {
    const double w = want[static_cast<size_t>(e)];
    const double err = std::fabs(got[static_cast<size_t>(e)] - w);
    if (err <= atol + rtol * std::fabs(w)) continue;
    const std::int64_t bh = e / p.d / rows, i = (e / p.d) % rows;
    if (head < 0) head = bh;
    if (bh != head) continue;
    if (first < 0) first = i;
    last = i;
  }
  if (head < 0) return "";
  std::ostringstream s;
  s << "rows " << first << ".." << last << " (of " << rows << ") of head (" << head / p.H << ","
    << head % p.H << ")";
  return s.str();
}

// Checks one backward run's gradients against the fp64 ones: unwritten
// elements, NaN, rows that see no key (dQ = 0), the bound; then what the
// pattern of wrong gradients points at.
Case check_gradients(const Problem& p, const std::vector<float>& dQ, const std::vector<float>& dK,
                     const std::vector<float>& dV, const ReferenceGradients& ref) {
  Case c;
  c.problem = p.describe();
  c.causal = p.causal;
  c.backward = true;
  auto fail = [&](const std::string& why) {
    c.pass = false;
    if (c.problems.size() < 8) c.problems.push_back(why);
  };
  const struct {
    const char* name;
    const std::vector<float>& got;
    const std::vector<double>& want;
    std::int64_t rows;
    double* err;
  } grads[] = {{"dQ", dQ, ref.dQ, p.Nq, &c.dq_err}, {"dK", dK, ref.dK, p.Nk, &c.dk_err},
               {"dV", dV, ref.dV, p.Nk, &c.dv_err}};
  bool wrong[3] = {false, false, false};
  for (int g = 0; g < 3; ++g) {
    const auto& x = grads[g];
    std::int64_t unwritten = 0, nans = 0, first_unwritten = -1, first_nan = -1;
    for (std::int64_t e = 0; e < static_cast<std::int64_t>(x.got.size()); ++e) {
      if (is_poison(x.got[static_cast<size_t>(e)])) {
        if (unwritten++ == 0) first_unwritten = e;
      } else if (std::isnan(x.got[static_cast<size_t>(e)])) {
        if (nans++ == 0) first_nan = e;
      }
    }
    if (unwritten) {
      fail(std::to_string(unwritten) + " of " + std::to_string(x.got.size()) + " elements of " +
           x.name + " were never written (still the poison), first " +
           grad_where(p, x.name, first_unwritten, x.rows) +
           ": every K/V block must store its dK_j, dV_j (look at the ragged last block), and dQ "
           "must be zeroed before the atomics add into it");
    }
    if (nans) {
      fail(std::to_string(nans) + " elements of " + x.name + " are NaN, first " +
           grad_where(p, x.name, first_nan, x.rows) +
           ": P = exp(S - L) in a row with L = -inf (a row that sees no key) gives exp(+inf - inf); "
           "such a row must get P = 0");
    }
    const Comparison cmp = compare(x.got.data(), x.want, kFp32GradTolerance);
    *x.err = cmp.max_abs_error;
    if (!cmp.ok() && !unwritten && !nans) {
      wrong[g] = true;
      fail(std::string(x.name) + " differs from the fp64 gradient in " +
           bad_rows(p, x.got, x.want, x.rows) + ": " + cmp.summary());
    }
  }
  // Rows that see no key (causal, Nq > Nk) have P = 0: their dQ is exactly 0.
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq && p.visible_keys(i) == 0; ++i) {
      bool bad = false;
      for (std::int64_t k = 0; k < p.d; ++k) bad = bad || dQ[static_cast<size_t>((bh * p.Nq + i) * p.d + k)] != 0.0f;
      if (bad) {
        fail("dQ is not 0 in " + grad_where(p, "dQ", (bh * p.Nq + i) * p.d, p.Nq) +
             "'s row, which sees no key: its P is 0, so is its gradient");
        bh = p.heads();
        break;
      }
    }
  }
  if (wrong[0] || wrong[1] || wrong[2]) {
    std::string why;
    if (wrong[2] && !wrong[0] && !wrong[1]) {
      why = "only dV: dV_j += P_ij^T dO_i over every Q block i that sees block j, with P (not dS)";
    } else if (wrong[2]) {
      why = "dV is wrong too, so P itself is: P_ij = exp(scale S_ij - L_i) recomputed with the "
            "forward's L (natural log; the kernel's log2 units: S scale log2e - L log2e), and "
            "the mask (query i sees key j iff j < visible_keys(i))";
    } else if (wrong[0] && wrong[1]) {
      why = "P is right (dV is) but dS is not: dS = P o (dP - D) with dP = dO V^T and "
            "D = rowsum(dO o O), and the scale folded into dS once";
    } else if (wrong[0]) {
      why = "only dQ: dQ_i += dS_ij K_j for every K/V block j the row sees (the atomics), dQ "
            "zeroed first";
    } else {
      why = "only dK: dK_j += dS_ij^T Q_i over every Q block i that sees block j (causal: from "
            "the first such block on)";
    }
    fail("likely cause: " + why);
  }
  return c;
}

std::string case_json(const Case& c) {
  std::ostringstream s;
  s << "{\"problem\": " << json_escape(c.problem) << ", \"causal\": " << (c.causal ? "true" : "false")
    << ", \"pass\": " << (c.pass ? "true" : "false");
  if (c.backward) {
    s << ", \"max_abs_error_dQ\": " << num(c.dq_err) << ", \"max_abs_error_dK\": " << num(c.dk_err)
      << ", \"max_abs_error_dV\": " << num(c.dv_err);
  } else {
    s << ", \"max_abs_error_O\": " << num(c.o_err) << ", \"max_abs_error_L\": " << num(c.l_err);
  }
  s << ", \"problems\": [";
  for (size_t k = 0; k < c.problems.size(); ++k) s << (k ? ", " : "") << json_escape(c.problems[k]);
  s << "], \"count_mismatches\": [";
  for (size_t k = 0; k < c.count_mismatches.size(); ++k) {
    s << (k ? ", " : "") << json_escape(c.count_mismatches[k]);
  }
  s << "]}";
  return s.str();
}

// A section of the report: the mirror's or the kernel's cases.
struct Section {
  std::string name;  // "mirror" or "kernel"
  bool graded = false;
  std::string skipped_why;
  std::vector<Case> cases;
  bool pass() const {
    for (const Case& c : cases) {
      if (!c.pass) return false;
    }
    return graded;
  }
};

void print_section(const Section& sec, std::ostream& out) {
  if (!sec.graded) {
    out << "  " << sec.name << ": not graded (" << sec.skipped_why << ")\n";
    return;
  }
  int passed = 0;
  for (const Case& c : sec.cases) passed += c.pass;
  out << "  " << sec.name << ": " << passed << " of " << sec.cases.size() << " cases pass\n";
  for (const Case& c : sec.cases) {
    char line[256];
    if (c.backward) {
      std::snprintf(line, sizeof line, "    %-4s %-52s dQ err %-9.2g dK err %-9.2g dV err %-9.2g",
                    c.pass ? "ok" : "FAIL", c.problem.c_str(), c.dq_err, c.dk_err, c.dv_err);
    } else {
      std::snprintf(line, sizeof line, "    %-4s %-52s O err %-9.2g L err %-9.2g",
                    c.pass ? "ok" : "FAIL", c.problem.c_str(), c.o_err, c.l_err);
    }
    out << line << "\n";
    for (const std::string& why : c.problems) out << "         - " << why << "\n";
  }
  // Patterns across cases: a hint where the failures cluster.
  int fail_causal = 0, fail_plain = 0;
  for (const Case& c : sec.cases) (c.causal ? fail_causal : fail_plain) += !c.pass;
  if (fail_causal && !fail_plain) {
    out << "  hint: only causal cases fail: check the mask (query i sees key j iff "
           "j <= i + Nk - Nq, i.e. j < visible_keys(i)) and the blocks you skip\n";
  }
}

// One problem of --backward: the backward mirror (cpu) and kernel (gpu) from the
// fp64 forward's O and L (rounded to fp32, as the stage's forward gives them)
// and a random dO, against the fp64 gradients.
void grade_backward_case(const Stage& s, const Problem& p, const Inputs& in,
                         const ReferenceResult& fwd, std::uint64_t seed, bool cpu, bool gpu,
                         Section& mirror, Section& kernel) {
  const std::vector<float> dO = random_output_grad(p, seed);
  const ReferenceGradients ref = reference_backward(p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
  auto failed = [&](const std::string& why) {
    Case c;
    c.problem = p.describe();
    c.causal = p.causal;
    c.backward = true;
    c.pass = false;
    c.problems.push_back(why);
    return c;
  };
  if (cpu && s.backward_mirror) {
    mirror.graded = true;
    const std::vector<float> O(fwd.O.begin(), fwd.O.end()), L(fwd.L.begin(), fwd.L.end());
    std::vector<float> dQ, dK, dV;
    poison(dQ, p.q_elems());
    poison(dK, p.kv_elems());
    poison(dV, p.kv_elems());
    try {
      const Cost counted = s.backward_mirror(p, {in.Q.data(), in.K.data(), in.V.data(), O.data(),
                                                 L.data(), dO.data(), dQ.data(), dK.data(), dV.data()});
      Case c = check_gradients(p, dQ, dK, dV, ref);
      compare_counts(counted, s.backward_model(p), c);
      mirror.cases.push_back(c);
    } catch (const std::exception& e) {
      mirror.cases.push_back(failed(std::string("the backward mirror threw: ") + e.what()));
    }
  }
  if (gpu) {
    kernel.graded = true;
    try {
      DeviceRun run(s, p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
      std::vector<float> dQ, dK, dV;
      run.run_backward(dQ, dK, dV);
      kernel.cases.push_back(check_gradients(p, dQ, dK, dV, ref));
    } catch (const std::exception& e) {
      kernel.cases.push_back(failed(std::string("the backward kernel failed to run: ") + e.what()));
    }
  }
}

Problem default_problem() {
  Problem p;
  p.B = 1;
  p.H = 8;
  p.Nq = p.Nk = 1024;
  p.d = 64;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string selector, mode = "all", reference, json_path;
  int iters = 20;
  bool backward = false;
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    auto val = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[k] + n : nullptr;
    };
    if (const char* v = val("--stage=")) selector = v;
    else if (const char* v2 = val("--mode=")) mode = v2;
    else if (const char* v3 = val("--reference=")) reference = v3;
    else if (const char* v4 = val("--json=")) json_path = v4;
    else if (const char* v5 = val("--iters=")) iters = std::atoi(v5);
    else if (a == "--backward") backward = true;
    else {
      std::cerr << "flashstep_grade: unknown argument '" << a
                << "'\nusage: flashstep_grade --stage=S [--mode=cpu|gpu|all] [--reference=S] "
                   "[--json=PATH] [--iters=N]\n";
      return kExitUsage;
    }
  }
  if (selector.empty() || (mode != "cpu" && mode != "gpu" && mode != "all")) {
    std::cerr << "flashstep_grade: need --stage=S and --mode cpu, gpu or all\n";
    return kExitUsage;
  }
  std::vector<const Stage*> stages, refs;
  try {
    stages = select_stages(selector);
    if (!reference.empty()) refs = select_stages(reference);
  } catch (const Error& e) {
    std::cerr << "flashstep_grade: " << e.what()
              << "\n(is the stage's folder in -DFLASHSTEP_EXTRA_STAGES?)\n";
    return kExitUsage;
  }
  if (backward) {
    for (const Stage* st : stages) {
      if (!st->backward) {
        std::cout << "flashstep_grade: stage " << st->name
                  << " has no backward pass: nothing for --backward to grade\n";
        return kExitSkip;
      }
    }
  }
  std::string why_no_gpu;
  const bool gpu = mode != "cpu" && cuda_device_available(&why_no_gpu);
  const std::vector<Problem> grid = test::ragged_problems();

  std::ostringstream json;
  json << "{\"stages\": [";
  bool all_pass = true, graded_any = false;
  for (size_t si = 0; si < stages.size(); ++si) {
    const Stage& s = *stages[si];
    std::cout << "== " << s.name << " (" << s.title << ")\n";
    Section mirror, kernel;
    mirror.name = "mirror (CPU)";
    kernel.name = "kernel (GPU)";
    if (mode == "gpu") mirror.skipped_why = "--mode=gpu";
    else if (!(backward ? s.backward_mirror != nullptr : s.mirror != nullptr)) {
      mirror.skipped_why = backward ? "the stage registers no CPU mirror of its backward"
                                    : "the stage registers no CPU mirror";
    }
    if (mode == "cpu") kernel.skipped_why = "--mode=cpu";
    else if (!gpu) kernel.skipped_why = "no GPU: " + why_no_gpu;
    std::uint64_t seed = 1;
    for (const Problem& p : grid) {
      const Inputs in = random_inputs(p, seed++);
      const ReferenceResult ref = reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
      if (backward) {
        grade_backward_case(s, p, in, ref, seed++, mode != "gpu", gpu, mirror, kernel);
        continue;
      }
      if (mode != "gpu" && s.mirror) {
        mirror.graded = true;
        std::vector<float> O, L;
        poison(O, p.q_elems());
        poison(L, p.lse_elems());
        Case c;
        try {
          const Cost counted = s.mirror(p, {in.Q.data(), in.K.data(), in.V.data(), O.data(), L.data()});
          c = check_outputs(s, p, O, L, ref);
          compare_counts(counted, s.model(p), c);
        } catch (const std::exception& e) {
          c.problem = p.describe();
          c.causal = p.causal;
          c.pass = false;
          c.problems.push_back(std::string("the mirror threw: ") + e.what());
        }
        mirror.cases.push_back(c);
      }
      if (gpu) {
        kernel.graded = true;
        Case c;
        try {
          DeviceRun run(s, p, in.Q.data(), in.K.data(), in.V.data());
          std::vector<float> O, L;
          run.run(O, L);
          c = check_outputs(s, p, O, L, ref);
        } catch (const std::exception& e) {
          c.problem = p.describe();
          c.causal = p.causal;
          c.pass = false;
          c.problems.push_back(std::string("the kernel failed to run: ") + e.what());
        }
        kernel.cases.push_back(c);
      }
    }
    print_section(mirror, std::cout);
    print_section(kernel, std::cout);

    // The model on the default problem, and time on a GPU beside the reference.
    const Problem dp = default_problem();
    const Cost m = backward ? s.backward_model(dp) : s.model(dp);
    std::cout << "  " << (backward ? "backward " : "") << "model on " << dp.describe() << ": HBM " << m.hbm_bytes() << " bytes (read "
              << m.hbm_read_bytes << ", write " << m.hbm_write_bytes << "), matmul FLOPs "
              << m.matmul_flops << ", other FLOPs " << m.nonmatmul_flops << ", thread blocks "
              << m.thread_blocks << "\n";
    bool counts_match = mirror.graded;
    for (const Case& c : mirror.cases) counts_match = counts_match && c.count_mismatches.empty();
    std::cout << "  mirror counts == model on every case: "
              << (mirror.graded ? (counts_match ? "yes" : "NO") : "not checked (no mirror)") << "\n";
    std::ostringstream timing;
    timing << "[";
    if (gpu && iters > 0) {
      std::vector<const Stage*> timed = {&s};
      timed.insert(timed.end(), refs.begin(), refs.end());
      const Inputs in = random_inputs(dp, 0);
      const std::vector<float> dO = random_output_grad(dp, 1);
      for (size_t k = 0; k < timed.size(); ++k) {
        try {
          if (backward && !timed[k]->backward) throw Error("it has no backward pass");
          DeviceRun run(*timed[k], dp, in.Q.data(), in.K.data(), in.V.data(),
                        backward ? dO.data() : nullptr);
          const Timing t = backward ? run.time_backward(3, iters) : run.time(3, iters);
          // The backward's FLOPs: 2.5 times the forward's (FlashAttention-2's convention).
          const double flops = (backward ? 2.5 : 1.0) * dp.forward_flops();
          const double tflops = flops / (t.median_ms / 1e3) / 1e12;
          std::cout << "  time " << timed[k]->name << ": median " << t.median_ms << " ms, "
                    << tflops << " TFLOP/s, HBM (model) "
                    << (backward ? timed[k]->backward_model(dp) : timed[k]->model(dp)).hbm_bytes()
                    << " bytes" << (backward ? " (backward)" : "") << "\n";
          timing << (k ? ", " : "") << "{\"stage\": " << json_escape(std::string(timed[k]->name))
                 << ", \"median_ms\": " << num(t.median_ms) << ", \"tflops\": " << num(tflops)
                 << ", \"hbm_bytes_model\": "
                 << (backward ? timed[k]->backward_model(dp) : timed[k]->model(dp)).hbm_bytes() << "}";
        } catch (const std::exception& e) {
          std::cout << "  time " << timed[k]->name << ": could not run: " << e.what() << "\n";
        }
      }
    } else {
      std::cout << "  time: not measured (" << (gpu ? "--iters=0" : "no GPU") << ")\n";
    }
    timing << "]";

    const bool pass = (!mirror.graded || mirror.pass()) && (!kernel.graded || kernel.pass());
    graded_any = graded_any || mirror.graded || kernel.graded;
    all_pass = all_pass && pass;
    std::cout << "  verdict: " << (mirror.graded || kernel.graded ? (pass ? "PASS" : "FAIL") : "NOT GRADED")
              << "\n";
    json << (si ? ", " : "") << "{\"stage\": " << json_escape(std::string(s.name))
         << ", \"pass\": " << (pass ? "true" : "false")
         << ", \"part\": " << json_escape(backward ? "backward" : "forward");
    for (const Section* sec : {&mirror, &kernel}) {
      json << ", \"" << (sec == &mirror ? "mirror" : "kernel") << "\": {\"graded\": "
           << (sec->graded ? "true" : "false") << ", \"skipped_why\": " << json_escape(sec->skipped_why)
           << ", \"cases\": [";
      for (size_t k = 0; k < sec->cases.size(); ++k) json << (k ? ", " : "") << case_json(sec->cases[k]);
      json << "]}";
    }
    json << ", \"counts_match_model\": " << (mirror.graded ? (counts_match ? "true" : "false") : "null")
         << ", \"model\": {\"problem\": " << json_escape(dp.describe())
         << ", \"hbm_read_bytes\": " << m.hbm_read_bytes << ", \"hbm_write_bytes\": "
         << m.hbm_write_bytes << ", \"matmul_flops\": " << m.matmul_flops
         << ", \"nonmatmul_flops\": " << m.nonmatmul_flops << ", \"thread_blocks\": "
         << m.thread_blocks << "}, \"timing\": " << timing.str() << "}";
  }
  json << "], \"pass\": " << (all_pass && graded_any ? "true" : "false") << ", \"graded\": "
       << (graded_any ? "true" : "false") << "}\n";
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << json.str();
    if (!f) {
      std::cerr << "flashstep_grade: cannot write " << json_path << "\n";
      return kExitUsage;
    }
    std::cout << "JSON report: " << json_path << "\n";
  }
  if (!graded_any) return kExitSkip;
  return all_pass ? kExitOk : kExitFailed;
}
