// Grouped-query attention (H_kv K/V heads shared by H query heads): the
// contract's checks, the fp64 reference against a naive expansion of the K/V
// heads, the refusal of stages without grouped heads, and the mirrors of the
// stages that have them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"

#include "common/check.h"
#include "common/error.h"
#include "common/reference.h"
#include "common/rounding.h"
#include "common/stage.h"
#include "common/npy.h"
#include "check_cost.h"
#include "flashstep.h"
#include "shapes.h"

using flashstep::Problem;
using flashstep::Stage;

using flashstep::test::expand_heads;
using flashstep::test::ungrouped;

TEST_CASE("grouped heads: validate wants H a multiple of H_kv >= 1, and says so") {
  Problem p;
  p.H = 8;
  for (std::int64_t ok : {1, 2, 4, 8}) {
    p.H_kv = ok;
    CHECK_NOTHROW(flashstep::validate(p));
  }
  p.H_kv = 0;
  CHECK_THROWS_WITH_AS(flashstep::validate(p), "H_kv must be >= 1, got 0", flashstep::Error);
  p.H_kv = 3;
  CHECK_THROWS_WITH_AS(flashstep::validate(p), doctest::Contains("H must be a multiple of H_kv"),
                       flashstep::Error);
  p.H_kv = 16;  // more K/V heads than query heads
  CHECK_THROWS_AS(flashstep::validate(p), flashstep::Error);
}

TEST_CASE("grouped heads: sizes, the head map by hand, and describe") {
  Problem p;
  p.B = 2;
  p.H = 8;
  p.Nq = 3;
  p.Nk = 5;
  p.d = 4;
  CHECK(p.kv_heads() == 8);
  CHECK_FALSE(p.grouped());
  CHECK(p.kv_head(13) == 13);
  p.H_kv = 2;  // groups of 4: heads 0-3 read K/V head 0, 4-7 head 1, per batch
  CHECK(p.grouped());
  CHECK(p.group() == 4);
  CHECK(p.kv_elems() == 2 * 2 * 5 * 4);
  CHECK(p.q_elems() == 2 * 8 * 3 * 4);
  const std::int64_t want[] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  for (std::int64_t bh = 0; bh < 16; ++bh) CHECK(p.kv_head(bh) == want[bh]);
  CHECK(p.describe() == "B=2 H=8 H_kv=2 Nq=3 Nk=5 d=4 non-causal");
  p.H_kv = 8;  // set but equal to H: not grouped, and described as before
  CHECK(p.describe() == "B=2 H=8 Nq=3 Nk=5 d=4 non-causal");
}

TEST_CASE("grouped heads: the reference equals the reference on K and V expanded to H heads") {
  std::uint64_t seed = 700;
  for (const Problem& p : flashstep::test::grouped_problems()) {
    CAPTURE(p.describe());
    const auto in = flashstep::random_inputs(p, seed++);
    REQUIRE(in.K.size() == static_cast<size_t>(p.kv_elems()));
    const auto grouped = flashstep::reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
    const auto K = expand_heads(p, in.K), V = expand_heads(p, in.V);
    const auto full = flashstep::reference_forward(ungrouped(p), in.Q.data(), K.data(), V.data());
    // The same arithmetic on the same numbers: equal, not merely close.
    CHECK(grouped.O == full.O);
    CHECK(grouped.L == full.L);
  }
}

TEST_CASE("grouped heads: the reference's dK and dV sum the expanded heads' gradients") {
  std::uint64_t seed = 800;
  for (const Problem& p : flashstep::test::grouped_problems()) {
    if (p.q_elems() > 60000) continue;  // the backward reference is Nq x Nk per head
    CAPTURE(p.describe());
    const auto in = flashstep::random_inputs(p, seed++);
    const auto dO = flashstep::random_output_grad(p, seed++);
    const auto g = flashstep::reference_backward(p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
    const auto K = expand_heads(p, in.K), V = expand_heads(p, in.V);
    const auto full = flashstep::reference_backward(ungrouped(p), in.Q.data(), K.data(), V.data(),
                                                    dO.data());
    CHECK(g.dQ == full.dQ);
    const std::int64_t head = p.Nk * p.d;
    double worst = 0.0;
    for (std::int64_t kv = 0; kv < p.B * p.kv_heads(); ++kv) {
      for (std::int64_t e = 0; e < head; ++e) {
        double dk = 0.0, dv = 0.0;
        for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
          if (p.kv_head(bh) != kv) continue;
          dk += full.dK[bh * head + e];
          dv += full.dV[bh * head + e];
        }
        worst = std::max({worst, std::abs(dk - g.dK[kv * head + e]),
                          std::abs(dv - g.dV[kv * head + e])});
      }
    }
    CHECK(worst < 1e-12);  // the same sums, in another order
  }
}

TEST_CASE("grouped heads: the naive 16-bit backward's dK and dV sum the group in fp32, then round") {
  // The low-precision gradient rule's naive backward (check.h) on a grouped
  // problem: dQ row for row as on K and V expanded to H heads, and each K/V
  // head's dK, dV the group's sum, rounded once. Against the expanded run,
  // which rounds every member's gradient, an element may differ by the
  // roundings: a unit roundoff of each member's term and one of the sum.
  std::uint64_t seed = 850;
  for (flashstep::DType t : {flashstep::DType::kBf16, flashstep::DType::kFp16}) {
    for (const Problem& grouped : flashstep::test::grouped_problems()) {
      if (grouped.q_elems() > 60000) continue;  // the naive backward is Nq x Nk per head
      Problem p = grouped;
      p.dtype = t;
      CAPTURE(p.describe());
      auto in = flashstep::random_inputs(p, seed++);
      auto dO = flashstep::random_output_grad(p, seed++);
      for (std::vector<float>* x : {&in.Q, &in.K, &in.V, &dO}) {
        flashstep::round_to_dtype(t, x->data(), static_cast<std::int64_t>(x->size()));
      }
      const auto g = flashstep::naive_low_precision_backward(p, in.Q.data(), in.K.data(),
                                                             in.V.data(), dO.data());
      const auto K = expand_heads(p, in.K), V = expand_heads(p, in.V);
      const auto full = flashstep::naive_low_precision_backward(ungrouped(p), in.Q.data(),
                                                                K.data(), V.data(), dO.data());
      CHECK(g.dQ == full.dQ);
      const double unit = t == flashstep::DType::kBf16 ? 0x1p-8 : 0x1p-11;
      const std::int64_t head = p.Nk * p.d;
      std::int64_t wrong = 0;
      for (std::int64_t kv = 0; kv < p.B * p.kv_heads(); ++kv) {
        for (std::int64_t e = 0; e < head; ++e) {
          double dk = 0.0, dv = 0.0, dk_abs = 0.0, dv_abs = 0.0;
          for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
            if (p.kv_head(bh) != kv) continue;
            dk += full.dK[bh * head + e];
            dv += full.dV[bh * head + e];
            dk_abs += std::abs(full.dK[bh * head + e]);
            dv_abs += std::abs(full.dV[bh * head + e]);
          }
          wrong += std::abs(dk - g.dK[kv * head + e]) > 2 * unit * dk_abs + 1e-6;
          wrong += std::abs(dv - g.dV[kv * head + e]) > 2 * unit * dv_abs + 1e-6;
        }
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("grouped heads: the runners refuse a stage without them in one line") {
  Problem p = flashstep::test::make_problem(1, 8, 4, 4, 16, false);
  p.H_kv = 2;
  for (const Stage& s : flashstep::all_stages()) {
    CAPTURE(s.name);
    CHECK_NOTHROW(flashstep::require_heads(s, ungrouped(p)));
    if (s.grouped_heads) {
      CHECK_NOTHROW(flashstep::require_heads(s, p));
    } else {
      CHECK_THROWS_WITH_AS(flashstep::require_heads(s, p),
                           ("stage " + std::string(s.name) +
                            " does not run grouped-query attention (H_kv = 2 < H = 8); stages "
                            "that do: see flashstep --list")
                               .c_str(),
                           flashstep::Error);
    }
    if (s.grouped_backward) {
      CHECK(s.grouped_heads);
      CHECK_NOTHROW(flashstep::require_heads(s, p, true));
    } else if (s.backward) {
      CHECK_THROWS_WITH_AS(flashstep::require_heads(s, p, true),
                           ("stage " + std::string(s.name) +
                            "'s backward does not run grouped-query attention (H_kv = 2 < H = 8); "
                            "it needs H_kv = H")
                               .c_str(),
                           flashstep::Error);
    }
  }
  // Stages 04, 05, 06 (split-Q and split-K), 07, 08 and 09 run them: those
  // of them this build registers (FLASHSTEP_STAGES_ONLY may leave some out).
  for (const Stage& s : flashstep::all_stages()) {
    for (std::string_view name : {"04_fa2_q_outer", "05_sequence_parallel", "06_warp_split_q",
                                  "06_warp_split_k", "07_tensor_core", "08_hopper",
                                  "09_split_kv"}) {
      if (s.name != name) continue;
      CAPTURE(name);
      CHECK(s.grouped_heads);
    }
    // Stage 07's two backwards run them, and no other stage's backward.
    const bool stage07_backward =
        s.name == "07_tensor_core" || s.name == "07_tensor_core_deterministic";
    CHECK(s.grouped_backward == stage07_backward);
  }
}

TEST_CASE("grouped heads: the mirrors of the stages that run them match the reference and the model") {
  std::uint64_t seed = 900;
  for (const Problem& grouped : flashstep::test::grouped_problems()) {
    const auto in = flashstep::random_inputs(grouped, seed++);
    for (const Stage& s : flashstep::all_stages()) {
      if (!s.mirror || !s.grouped_heads) continue;
      Problem p = grouped;
      p.dtype = s.dtypes.front();
      CAPTURE(s.name);
      CAPTURE(p.describe());
      flashstep::Inputs sent = in;
      for (std::vector<float>* x : {&sent.Q, &sent.K, &sent.V}) {
        flashstep::round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
      }
      std::vector<float> O(static_cast<size_t>(p.q_elems()), NAN);
      std::vector<float> L(static_cast<size_t>(p.lse_elems()), NAN);
      const auto counted = s.mirror(p, {sent.Q.data(), sent.K.data(), sent.V.data(), O.data(), L.data()});
      const auto c = flashstep::check_forward(p, O.data(), L.data(), flashstep::forward_truth(p, in));
      CHECK_MESSAGE(c.ok(), c.summary());
      flashstep::test::check_counts_equal(counted, s.model(p));
      // Stages 04-08 have each query head read its group's K/V tiles itself:
      // the model counts what the algorithm asks for, as with H_kv = H. Stage
      // 09 reads them once per group (tests/test_split_kv.cpp).
      if (s.name.substr(0, 3) != "09_") CHECK(s.model(p) == s.model(ungrouped(p)));
    }
  }
}

namespace {
struct CliResult {
  int code;
  std::string out, err;
};

CliResult run_cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = flashstep::cli::run(args, out, err);
  return {code, out.str(), err.str()};
}
}  // namespace

TEST_CASE("grouped heads: the CLI's --H-kv, and --load taking H_kv from K's shape") {
  using flashstep::cli::parse_args;
  CHECK(parse_args({"--H", "8", "--H-kv", "2"}).problem.kv_heads() == 2);
  CHECK_THROWS_WITH_AS(parse_args({"--H", "8", "--H-kv", "3"}),
                       doctest::Contains("H must be a multiple of H_kv"), flashstep::Error);
  // --backward on a grouped problem needs a stage whose backward runs it
  // (Stage::grouped_backward): stage 05's does not, in one line and exit 2.
  CHECK_THROWS_WITH_AS(parse_args({"--H-kv", "2", "--backward", "--stage", "05"}),
                       doctest::Contains("--backward --H-kv 2 < H: no selected stage's backward "
                                         "runs grouped-query attention (these do: 07_tensor_core"),
                       flashstep::Error);
  const auto refused = run_cli({"model", "--H-kv", "2", "--backward", "--stage", "05"});
  CHECK(refused.code == 2);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  CHECK(parse_args({"--H-kv", "2", "--backward", "--stage", "07_tensor_core"}).backward);
  const auto grouped_backward = run_cli({"model", "--H", "8", "--H-kv", "2", "--backward",
                                         "--stage", "07", "--format", "csv"});
  CHECK(grouped_backward.code == 0);
  CHECK(grouped_backward.out.find("07_tensor_core_deterministic") != std::string::npos);
  // Stages without grouped heads are skipped, with one line naming them.
  const auto all = run_cli({"model", "--H-kv", "2", "--format", "csv"});
  CHECK(all.code == 0);
  CHECK(all.err.find("skipping 01_naive") != std::string::npos);
  CHECK(all.out.find("04_fa2_q_outer") != std::string::npos);
  CHECK(all.out.find("01_naive") == std::string::npos);
  const auto none = run_cli({"model", "--H-kv", "2", "--stage", "01"});
  CHECK(none.code == 2);
  CHECK(none.err.find("no selected stage runs grouped-query attention") != std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() / "flashstep_test_grouped_load";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<float> q(2 * 4 * 5 * 4, 0.5f), kv(2 * 2 * 7 * 4, 0.25f);
  flashstep::write_npy((dir / "Q.npy").string(), {2, 4, 5, 4}, q.data());
  flashstep::write_npy((dir / "K.npy").string(), {2, 2, 7, 4}, kv.data());
  flashstep::write_npy((dir / "V.npy").string(), {2, 2, 7, 4}, kv.data());
  const auto loaded = run_cli({"model", "--load", dir.string(), "--stage", "04"});
  CHECK(loaded.code == 0);
  CHECK(loaded.out.find("H_kv=2") != std::string::npos);
  const auto contradict = run_cli({"model", "--load", dir.string(), "--H-kv", "1"});
  CHECK(contradict.code == 2);
  CHECK(contradict.err.find("--H-kv 1 contradicts the loaded files' 2") != std::string::npos);
  const std::vector<float> kv3(2 * 3 * 7 * 4, 0.25f);  // 3 K/V heads: 4 % 3 != 0
  flashstep::write_npy((dir / "K.npy").string(), {2, 3, 7, 4}, kv3.data());
  flashstep::write_npy((dir / "V.npy").string(), {2, 3, 7, 4}, kv3.data());
  const auto bad = run_cli({"model", "--load", dir.string()});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("H is not a multiple of H_kv") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("grouped heads: the C ABI's flashstep_forward_v2 and flashstep_stage_grouped_heads") {
  CHECK(flashstep_stage_grouped_heads("05") == 1);
  CHECK(flashstep_stage_grouped_heads("01") == 0);
  CHECK(flashstep_stage_grouped_heads("nope") == -1);
  constexpr std::int64_t B = 2, H = 4, Nq = 3, Nk = 5, d = 8;
  std::vector<float> Q(B * H * Nq * d), K(B * 1 * Nk * d), V(B * 1 * Nk * d), O(B * H * Nq * d),
      L(B * H * Nq);
  auto call = [&](const char* stage, std::int64_t H_kv) {
    return flashstep_forward_v2(stage, FLASHSTEP_FP32, B, H, H_kv, Nq, Nk, d, 0, 0.0, Q.data(),
                                K.data(), V.data(), O.data(), L.data(), nullptr);
  };
  CHECK(call("05", 3) == FLASHSTEP_EINVAL);
  CHECK(std::string(flashstep_last_error()).find("H must be a multiple of H_kv") !=
        std::string::npos);
  CHECK(call("05", 0) == FLASHSTEP_EINVAL);
  CHECK(call("05", -4) == FLASHSTEP_EINVAL);
  CHECK(call("05", INT64_MAX) == FLASHSTEP_EINVAL);
  CHECK(call(nullptr, 1) != FLASHSTEP_OK);
  CHECK(flashstep_forward_v2("05", 99, B, H, 1, Nq, Nk, d, 0, 0.0,
                             Q.data(), K.data(), V.data(), O.data(), L.data(), nullptr) ==
        FLASHSTEP_EINVAL);
  CHECK(call("01", 1) == FLASHSTEP_ESTAGE);
  CHECK(std::string(flashstep_last_error()).find("does not run grouped-query attention") !=
        std::string::npos);
  // Valid arguments on host memory: refused at the device-pointer check, not before.
  const int code = call("05", 1);
  CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
  if (code == FLASHSTEP_EINVAL) {
    CHECK(std::string(flashstep_last_error()).find("must be device or managed memory") !=
          std::string::npos);
  }
}

TEST_CASE("grouped heads: the C ABI's flashstep_backward_v2 and flashstep_stage_grouped_backward") {
  CHECK(flashstep_stage_grouped_backward("07_tensor_core") == 1);
  CHECK(flashstep_stage_grouped_backward("07_tensor_core_deterministic") == 1);
  CHECK(flashstep_stage_grouped_backward("05") == 0);  // a backward, but H_kv = H only
  CHECK(flashstep_stage_grouped_backward("01") == 0);  // no backward
  CHECK(flashstep_stage_grouped_backward("nope") == -1);
  constexpr std::int64_t B = 2, H = 4, Nq = 3, Nk = 5, d = 8;
  // 2-byte elements for stage 07 (bf16), 4 for stage 05 (fp32): sized for fp32.
  std::vector<float> Q(B * H * Nq * d), K(B * 1 * Nk * d), V(B * 1 * Nk * d), O(B * H * Nq * d),
      L(B * H * Nq), dO(B * H * Nq * d), dQ(B * H * Nq * d), dK(B * 1 * Nk * d),
      dV(B * 1 * Nk * d);
  auto call = [&](const char* stage, int dtype, std::int64_t H_kv) {
    return flashstep_backward_v2(stage, dtype, B, H, H_kv, Nq, Nk, d, 0, 0.0, Q.data(),
                                 K.data(), V.data(), O.data(), L.data(), dO.data(), dQ.data(),
                                 dK.data(), dV.data(), nullptr);
  };
  CHECK(call("07_tensor_core", FLASHSTEP_BF16, 3) == FLASHSTEP_EINVAL);
  CHECK(std::string(flashstep_last_error()).find("H must be a multiple of H_kv") !=
        std::string::npos);
  CHECK(call("07_tensor_core", FLASHSTEP_BF16, 0) == FLASHSTEP_EINVAL);
  CHECK(call("05", FLASHSTEP_FP32, 1) == FLASHSTEP_ESTAGE);
  CHECK(std::string(flashstep_last_error()) ==
        "stage 05_sequence_parallel's backward does not run grouped-query attention (H_kv = 1 < "
        "H = 4); it needs H_kv = H");
  CHECK(call("01", FLASHSTEP_FP32, 1) == FLASHSTEP_ESTAGE);  // no backward at all
  // Valid arguments on host memory: refused at the device-pointer check, not before.
  const int code = call("07_tensor_core", FLASHSTEP_BF16, 1);
  CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
  if (code == FLASHSTEP_EINVAL) {
    CHECK(std::string(flashstep_last_error()).find("must be device or managed memory") !=
          std::string::npos);
  }
}
