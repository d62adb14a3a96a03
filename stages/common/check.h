/// \file check.h
/// \brief Inputs from a seed, and comparison against the fp64 reference: the
/// fp32 bound, and FlashAttention's rule for fp16 and bf16.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "problem.h"
#include "reference.h"

namespace flashstep {

/// Q, K and V on the host.
struct Inputs {
  std::vector<float> Q;  ///< [B, H, Nq, d]
  std::vector<float> K;  ///< [B, H_kv, Nk, d]
  std::vector<float> V;  ///< [B, H_kv, Nk, d]
};

/// Mean of the random inputs. Not zero: zero-mean V makes O tiny and relative
/// errors meaningless; shifted Q and K make the logits' row max matter.
inline constexpr float kInputMean = 0.5f;

/// Q, K, V drawn from Normal(kInputMean, 1) with a fixed seed (same seed, same data).
Inputs random_inputs(const Problem& p, std::uint64_t seed);

/// The backward's input dO [B, H, Nq, d]: the gradient of the loss in O, drawn
/// from Normal(kInputMean, 1) like the inputs, from its own seed. A nonzero
/// mean makes dP and D = rowsum(dO o O) large and close, so dS = P o (dP - D)
/// carries the cancellation a real backward must survive.
std::vector<float> random_output_grad(const Problem& p, std::uint64_t seed);

/// Elementwise bound |got - want| <= atol + rtol * |want|.
struct Tolerance {
  double atol;  ///< absolute part: matters where the reference is near 0
  double rtol;  ///< relative part
};

/// The bound every fp32 stage meets against the fp64 reference. fp32 sums of
/// up to ~1e3 terms of size ~1 carry relative rounding near 1e-6; 1e-4 leaves
/// two orders of margin while still catching any wrong rescale or mask
/// (those give errors of order 1e-2 and up). atol covers elements of O near 0.
inline constexpr Tolerance kFp32Tolerance{1e-5, 1e-4};

/// The bound every fp32 gradient meets against the fp64 reference: the
/// forward's relative part, ten times its absolute part. The gradients inherit
/// the forward's fp32 errors in O and L (D = rowsum(dO o O) sums d of them),
/// and dS = P o (dP - D) subtracts two numbers of size near |dO| |V| sqrt(d)
/// that agree in their leading digits, so elements of dQ and dK near zero
/// carry absolute errors a little above the forward's 1e-5. A wrong mask,
/// scale or recomputed P still errs by 1e-2 and more.
inline constexpr Tolerance kFp32GradTolerance{1e-4, 1e-4};

/// Outcome of comparing one output array with the reference.
struct Comparison {
  std::int64_t checked = 0;      ///< elements compared
  std::int64_t skipped = 0;      ///< elements not compared: NaN in the reference
  std::int64_t mismatches = 0;   ///< elements outside the bound (NaN got: always)
  double max_abs_error = 0.0;    ///< over finite pairs
  double max_rel_error = 0.0;    ///< |got - want| / |want| over |want| > atol
  std::int64_t worst_index = -1; ///< element with the largest error / bound ratio
  std::string first_mismatches;  ///< up to a few "index: got X, want Y" lines

  /// Every compared element within the bound, and at least one compared: a
  /// comparison of nothing (a reference NaN everywhere, from NaN or Inf in
  /// the inputs) is no pass. Callers report checked == 0 as "unchecked".
  bool ok() const { return checked > 0 && mismatches == 0; }
  /// One line: "max abs 1.2e-07, max rel 3.4e-06, 0 of 4096 outside" plus
  /// the elements skipped and the first mismatches when there are any.
  std::string summary() const;
};

/// Compares got (fp32) with want (fp64). Infinite reference values must be
/// matched exactly; a NaN reference element (a row the reference did not
/// compute, or NaN or Inf in the inputs) is skipped and counted as skipped.
Comparison compare(const float* got, const std::vector<double>& want, Tolerance tol);

/// The low-precision rule, FlashAttention's own (its tests'
/// `(out - out_ref).abs().max() <= 2 * (out_pt - out_ref).abs().max()`): a
/// stage in fp16 or bf16 passes when
///
///   max |O - O_ref| <= 2 max |O_naive - O_ref| + kLowPrecisionFloor
///
/// where O_ref is the fp64 reference computed from the inputs rounded to the
/// type (what the stage actually saw, so input rounding is no one's error),
/// and O_naive is the same attention done naively in that type
/// (naive_low_precision_rows: S and softmax in fp32, P and O rounded to the
/// type). Why: no fixed tolerance fits every problem, since rounding P and O
/// to 8 or 11 significant bits costs more or less depending on the sizes and
/// the data; measured against what the plain computation in that type loses
/// on the same inputs, a kernel passes when it loses at most twice that, and
/// a wrong scale, mask or rescale, which errs by far more, fails. The floor
/// covers problems on which the naive computation is exact (a row that sees
/// one key: O = V in both) and a correct kernel may still differ by fp32's
/// last bits: it is the fp32 bound's absolute part.
inline constexpr double kLowPrecisionFloor = kFp32Tolerance.atol;

/// What a forward's O and L are checked against: the fp64 reference computed
/// from the inputs rounded to p.dtype, and in fp16/bf16 the naive O in that
/// type. Rows the reference leaves out (row_step > 1) are NaN in both.
struct ForwardTruth {
  DType dtype = DType::kFp32;   ///< the element type the inputs were rounded to
  ReferenceResult reference;    ///< fp64 O [B,H,Nq,d] and L [B,H,Nq]
  std::vector<double> naive_O;  ///< fp16/bf16 only: naive_low_precision_rows; empty in fp32
};

/// The fp64 reference checks every query row while B*H*Nq*Nk*d stays under
/// this many multiply-adds (about a second on one core); above it, every
/// k-th row (reference_row_step), so large problems stay checkable.
inline constexpr double kReferenceMacBudget = 4e8;

/// The row step that keeps p's fp64 reference within kReferenceMacBudget:
/// 1 (every row) for small problems, ceil(B*H*Nq*Nk*d / budget) above.
std::int64_t reference_row_step(const Problem& p);

/// The truth for p.dtype from the host inputs as drawn or loaded (fp32, not
/// yet rounded: this rounds a copy, as the runner rounds what it sends to the
/// device), on query rows 0, row_step, 2*row_step, ... of every head.
ForwardTruth forward_truth(const Problem& p, const Inputs& in, std::int64_t row_step = 1);

/// The verdict on one forward run's O and L.
struct ForwardCheck {
  DType dtype = DType::kFp32;  ///< the run's element type, which picks the rule
  Comparison O;                ///< O against the reference, within o_tolerance
  std::optional<Comparison> L; ///< L against the reference, within kFp32Tolerance; or unchecked
  Tolerance o_tolerance{};     ///< fp32: kFp32Tolerance; fp16/bf16: {2 naive error + floor, 0}
  double naive_error = 0.0;    ///< fp16/bf16: max |O_naive - O_ref| over the rows compared

  /// Every compared element within its bound, and at least one element of O
  /// (and of L, when checked) compared: a check that checked nothing is no pass.
  bool ok() const;
  /// One line: the O comparison (with the low-precision bound and where it
  /// comes from), then L's.
  std::string summary() const;
};

/// Checks a stage's O [B,H,Nq,d] and, unless L is null, L [B,H,Nq] (both
/// fp32, as DeviceRun returns them) against `truth`: O by kFp32Tolerance in
/// fp32 and by the low-precision rule above in fp16 and bf16; L by
/// kFp32Tolerance in every type. L stays fp32 in every stage, and its path
/// (S in fp32 from the rounded inputs, the row max, the fp32 sum of exp) never
/// rounds to 16 bits, so it owes the fp32 accuracy against the reference from
/// the same rounded inputs. Throws flashstep::Error when `truth` was made for
/// another element type than p.dtype.
ForwardCheck check_forward(const Problem& p, const float* O, const float* L,
                           const ForwardTruth& truth);

/// The low-precision rule for gradients: FlashAttention's rule again (its
/// tests check dq, dk and dv as they check out), one gradient at a time,
///
///   max |dX - dX_ref| <= 2 max |dX_naive - dX_ref| + floor_X
///
/// where dX_ref is the fp64 gradient of the inputs (Q, K, V and dO) rounded to
/// the type and dX_naive is naive_low_precision_backward's (reference.h),
/// reading the same O as the stage's backward. O is an input of the backward
/// (FlashAttention's too: D = rowsum(dO o O) comes from the forward's output),
/// and its rounding to the type is the forward's error, held to the forward's
/// rule, as the inputs' rounding is no one's. A naive backward that read its
/// own O would carry other roundings of O, and D passes them on uncancelled
/// (dS_ij = P_ij (dP_ij - D_i) moves by P_ij times dO_i . (O_i's error)): at
/// small d, where D sums few of them, correct backwards missed the bound
/// against that naive in about 1 seed in 100 (d = 1, fp16: dK off by 0.002
/// against a bound of 0.00115 from a naive error of 0.0005). With the same O
/// the two round alike, and no output-rounding term is needed: over 150 seeds
/// at d = 1 and 16 and the ragged grid, stage 07's mirror stays within 0.65
/// of the bound.
/// The floor is larger than the forward's, for the cancellation in
/// dS = P o (dP - D): dP_ij = dO_i . V_j and D_i = dO_i . O_i are two fp32
/// sums of d products that nearly agree (O_i is a weighted mean of the V_j),
/// and a kernel and the naive computation sum them in different orders, so
/// their dS differ by up to the fp32 error bound of those sums even where
/// the naive dS happens to be exact (one key per row: O = V, dP = D, dS = 0).
/// So floor_dQ and floor_dK are the largest over their elements of that
/// worst-case bound carried into them,
///
///   |dS_ij error| <= P_ij gamma_{d+2} (sum_k |dO_ik V_jk| + sum_k |dO_ik O_ik|) (1 + u)
///   floor_dQ = max_ik |scale| sum_j |dS_ij error| |K_jk|
///   floor_dK = max_jk |scale| sum_i |dS_ij error| |Q_ik|
///
/// (gamma_n = n u32 / (1 - n u32), u32 = 2^-24, Higham's bound for a sum of n
/// fp32 roundings: d products and adds, the subtraction, the product with
/// P; u is the type's unit roundoff, dS's rounding to it), plus the fp32
/// gradient bound's absolute part kFp32GradTolerance.atol; floor_dV is that
/// absolute part alone (dV = P^T dO subtracts nothing). The bound is
/// computed in fp64 from the rounded inputs and the O the naive reads.
struct BackwardTruth {
  DType dtype = DType::kFp32;    ///< the element type the inputs were rounded to
  ReferenceGradients reference;  ///< fp64 dQ [B,H,Nq,d], dK and dV [B,H,Nk,d]
  ReferenceGradients naive;      ///< fp16/bf16: naive_low_precision_backward; empty in fp32
  double floor_dQ = 0.0;         ///< fp16/bf16: the floors above; 0 in fp32
  double floor_dK = 0.0;
  double floor_dV = 0.0;
};

/// The truth for p.dtype from the host inputs and dO as drawn (fp32, not yet
/// rounded: this rounds copies, as the runner rounds what it sends to the
/// device). Every row: the backward's gradients depend on every row. O_read:
/// the forward's O [B,H,Nq,d] that the stage's backward read (in p.dtype, as
/// DeviceRun::run_backward returns it); the naive backward reads it too. It
/// must pass the forward's rule (check_forward), or this throws
/// flashstep::Error: a wrong O would loosen the bound. Null: the naive reads
/// its own O (naive_low_precision_rows), for a check without the stage's O.
/// Unused in fp32.
BackwardTruth backward_truth(const Problem& p, const Inputs& in, const std::vector<float>& dO,
                             const std::vector<float>* O_read = nullptr);

/// The verdict on one gradient.
struct GradientCheck {
  Comparison c;              ///< against the reference, within `tolerance`
  Tolerance tolerance{};     ///< fp32: kFp32GradTolerance; fp16/bf16: {2 naive error + floor, 0}
  double naive_error = 0.0;  ///< fp16/bf16: max |dX_naive - dX_ref|
  double floor = 0.0;        ///< fp16/bf16: the floor above
};

/// The verdict on one backward run's dQ, dK and dV.
struct BackwardCheck {
  DType dtype = DType::kFp32;
  GradientCheck dQ, dK, dV;

  /// Every compared element of the three within its bound, and at least one
  /// element of each compared.
  bool ok() const;
  /// Three lines, "dQ: ...", "dK: ...", "dV: ...", each with its bound and,
  /// in fp16/bf16, where the bound comes from.
  std::string summary() const;
};

/// Checks a backward's dQ [B,H,Nq,d], dK and dV [B,H,Nk,d] (fp32, as
/// DeviceRun returns them) against `truth`: by kFp32GradTolerance in fp32,
/// by the rule above in fp16 and bf16. Throws flashstep::Error when `truth`
/// was made for another element type than p.dtype.
BackwardCheck check_backward(const Problem& p, const float* dQ, const float* dK, const float* dV,
                             const BackwardTruth& truth);

}  // namespace flashstep
