// Stage 02's backward model (standard attention's backward, P read from HBM)
// against counts made here from first principles, and the facts its README
// states: Theta(N^2) HBM traffic and the memory of P plus dS.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "common/naive_matmul.h"
#include "common/row_dot.h"
#include "common/stage.h"
#include "shapes.h"

using flashstep::Cost;
using flashstep::Gemm;
using flashstep::kFloatBytes;
using flashstep::Problem;
using flashstep::Stage;
using flashstep::test::make_problem;

namespace {

constexpr std::int64_t kTile = flashstep::kNaiveTile;

const Stage& stage_02() {
  for (const Stage& s : flashstep::all_stages()) {
    if (s.name == "02_safe_softmax") return s;
  }
  FAIL("stage 02_safe_softmax is not registered");
  throw;  // unreachable: FAIL throws
}

// A 32 x 32 tiled GEMM C [M, N] = alpha op(A) [M, K] op(B) [K, N] per head,
// counted block by block: block (m0, n0) loads the rows of op(A) and the
// columns of op(B) that its tile covers, each K long, and writes its tile.
Cost count_tiled_gemm(std::int64_t heads, std::int64_t M, std::int64_t N, std::int64_t K,
                      bool scaled) {
  Cost c;
  for (std::int64_t m0 = 0; m0 < M; m0 += kTile) {
    for (std::int64_t n0 = 0; n0 < N; n0 += kTile) {
      const std::int64_t rows = std::min(kTile, M - m0), cols = std::min(kTile, N - n0);
      const std::int64_t loaded = heads * (rows + cols) * K;
      c.hbm_read_bytes += loaded * kFloatBytes;
      c.sram_write_bytes += loaded * kFloatBytes;
      c.hbm_write_bytes += heads * rows * cols * kFloatBytes;
      // Each output element: K multiply-adds, each reading one element of
      // either tile buffer.
      c.sram_read_bytes += heads * rows * cols * 2 * K * kFloatBytes;
      c.matmul_flops += heads * rows * cols * 2 * K;
      if (scaled) c.nonmatmul_flops += heads * rows * cols;
      c.thread_blocks += heads;
    }
  }
  return c;
}

// dS = P o (dP - D): one block per row reads P_r and dP_r, loads D_r once,
// writes dS_r; a subtract and a multiply per element.
Cost count_ds_kernel(const Problem& p) {
  const std::int64_t rows = p.heads() * p.Nq;
  Cost c;
  c.hbm_read_bytes = rows * (2 * p.Nk + 1) * kFloatBytes;
  c.hbm_write_bytes = rows * p.Nk * kFloatBytes;
  c.nonmatmul_flops = rows * p.Nk * 2;
  c.thread_blocks = rows;
  return c;
}

// The backward's five steps: D, dV = P^T dO, dP = dO V^T, dS, dQ = scale dS K,
// dK = scale dS^T Q. scale = 1 (d = 1 by default) skips the alpha multiply.
Cost count_backward(const Problem& p) {
  const bool scaled = p.softmax_scale() != 1.0;
  const std::int64_t BH = p.heads();
  Cost c = flashstep::row_dot_cost(p);
  c += count_tiled_gemm(BH, p.Nk, p.d, p.Nq, false);   // dV [Nk, d], summed over Nq
  c += count_tiled_gemm(BH, p.Nq, p.Nk, p.d, false);   // dP [Nq, Nk], summed over d
  c += count_ds_kernel(p);
  c += count_tiled_gemm(BH, p.Nq, p.d, p.Nk, scaled);  // dQ [Nq, d], summed over Nk
  c += count_tiled_gemm(BH, p.Nk, p.d, p.Nq, scaled);  // dK [Nk, d], summed over Nq
  return c;
}

void check_equal(const Cost& got, const Cost& want) {
  CHECK(got.hbm_read_bytes == want.hbm_read_bytes);
  CHECK(got.hbm_write_bytes == want.hbm_write_bytes);
  CHECK(got.sram_read_bytes == want.sram_read_bytes);
  CHECK(got.sram_write_bytes == want.sram_write_bytes);
  CHECK(got.matmul_flops == want.matmul_flops);
  CHECK(got.nonmatmul_flops == want.nonmatmul_flops);
  CHECK(got.thread_blocks == want.thread_blocks);
  CHECK(got.skipped_tiles == want.skipped_tiles);
  CHECK(got.barriers == want.barriers);
  CHECK(got.mask_tests == want.mask_tests);
}

}  // namespace

TEST_CASE("stage 02 registers a backward with a model and a workspace, and no CPU mirror") {
  const Stage& s = stage_02();
  // doctest cannot print a function pointer: compare as bools.
  CHECK(static_cast<bool>(s.backward));
  CHECK(static_cast<bool>(s.backward_workspace_bytes));
  CHECK(static_cast<bool>(s.backward_model));
  CHECK_FALSE(static_cast<bool>(s.backward_mirror));
}

TEST_CASE("gemm_cost counts what a 32 x 32 tiled GEMM moves, whichever operand is transposed") {
  for (const bool transpose_A : {false, true}) {
    for (const bool transpose_B : {false, true}) {
      Gemm g;
      g.batch = 3;
      g.M = 45;
      g.N = 37;
      g.K = 70;
      g.transpose_A = transpose_A;
      g.transpose_B = transpose_B;
      CAPTURE(transpose_A);
      CAPTURE(transpose_B);
      check_equal(flashstep::gemm_cost(g), count_tiled_gemm(3, 45, 37, 70, false));
      g.alpha = 0.125f;
      check_equal(flashstep::gemm_cost(g), count_tiled_gemm(3, 45, 37, 70, true));
    }
  }
}

TEST_CASE("gemm_cost reproduces the forward's kernels 1 and 3, which tile the same way") {
  for (const Problem& p :
       {make_problem(2, 3, 113, 203, 40, false), make_problem(1, 2, 1023, 1024, 64, true)}) {
    CAPTURE(p.describe());
    Gemm scores;  // S [Nq, Nk] = scale Q [Nq, d] K^T [d, Nk]
    scores.batch = p.heads();
    scores.M = p.Nq;
    scores.N = p.Nk;
    scores.K = p.d;
    scores.transpose_B = true;
    scores.alpha = static_cast<float>(p.softmax_scale());
    check_equal(flashstep::gemm_cost(scores), flashstep::scores_cost(p));
    Gemm pv;  // O [Nq, d] = P [Nq, Nk] V [Nk, d]
    pv.batch = p.heads();
    pv.M = p.Nq;
    pv.N = p.d;
    pv.K = p.Nk;
    check_equal(flashstep::gemm_cost(pv), flashstep::pv_cost(p));
  }
}

TEST_CASE("stage 02's backward model: D, four tiled GEMMs and the dS kernel, counted by block") {
  Problem unit_scale = make_problem(1, 2, 128, 217, 59, false);
  unit_scale.scale = 1.0;  // no alpha multiply in dQ and dK
  for (const Problem& p :
       {make_problem(2, 3, 113, 203, 40, false), make_problem(2, 3, 113, 203, 40, true),
        make_problem(2, 1, 239, 1, 64, true), make_problem(1, 2, 1, 239, 16, false),
        make_problem(2, 1, 70, 45, 1, false), unit_scale}) {
    CAPTURE(p.describe());
    const Cost model = stage_02().backward_model(p);
    check_equal(model, count_backward(p));
    // Four products of Nq x Nk x d against the forward's two; causal skips nothing.
    CHECK(model.matmul_flops == 2 * stage_02().model(p).matmul_flops);
  }
}

TEST_CASE("stage 02's backward moves Theta(N^2) bytes and holds P and dS, each B*H*N^2 floats") {
  const Problem p2k = make_problem(1, 32, 2048, 2048, 64, false);
  const Problem p4k = make_problem(1, 32, 4096, 4096, 64, false);
  const double ratio = static_cast<double>(stage_02().backward_model(p4k).hbm_bytes()) /
                       static_cast<double>(stage_02().backward_model(p2k).hbm_bytes());
  CHECK(ratio == doctest::Approx(4.0).epsilon(0.01));

  // The README's example: FlashAttention-2's N = 16384, d = 64, B = 1, H = 32.
  // P (the forward's workspace, saved) and dP/dS (the backward's, beside D).
  const Problem p = make_problem(1, 32, 16384, 16384, 64, false);
  const std::int64_t n_by_n = p.score_elems() * kFloatBytes;
  CHECK(stage_02().workspace_bytes(p) == n_by_n);
  CHECK(stage_02().backward_workspace_bytes(p) == n_by_n + p.lse_elems() * kFloatBytes);
  CHECK(2 * n_by_n == 68719476736);  // 68.7 GB
}
