// Stage 09's split kernel for wide groups on Hopper's asynchronous tensor
// cores (sm_90a): wgmma, as stage 08 uses it, for decodes whose group of
// query rows is more than one kRows tile (split_kv_plan.h, wide_group).
//
// Why a third kernel: with grouped heads the rows a K/V byte feeds grow with
// the group. MQA on 32 heads with Nq = 4 has 128 rows a K/V head: 128 FLOPs
// per byte of K and V, so at the copy ceiling the tensor cores must sustain
// 540 TFLOP/s, and 85 % of it 460. The mma.sync kernel takes such a group
// in four 32-row tiles at about 190 TFLOP/s; this kernel takes it in two
// blocks of one warpgroup and 64 rows (wgmma's M) each, and runs each
// product as one wgmma chain.
//
//   block (row tile of kWideRows, split s, K/V head kvh), 128 threads
//   the tile's rows r0 .. r0 + 63 (r = g Nq + i, as in the plan), all of the
//   split's keys, in K/V tiles of kWideKeys:
//   per tile    S = Qi Kj^T      8 x wgmma m64n64k16, Qi and Kj in smem
//               softmax          the thread's rows, as stage 08's
//               O~ += P~ Vj      4 x wgmma m64n128k16, P~ from registers
//
// The tiles arrive by cp.async (every thread copies its share, written in the
// 128-byte swizzle the descriptors read), kWideStages deep. No producer warp
// and no TMA: a decode's tile is 64 keys of one head, and two blocks an SM
// keep 2 to 4 of them in flight; the two blocks share no barrier, so one's
// softmax runs beside the other's products. Within a block the softmax of
// tile t + 1 runs while O~ += P~_t Vt is on the tensor cores
// (FlashAttention-3's intra-warpgroup overlap): S_{t+1} is issued first,
// then P~_t Vt, and the warpgroup waits for S_{t+1} alone before its
// exponentials. The row tiles of one split are consecutive blocks, so they
// run at the same time and all but the first find the split's keys in L2.
//
// What a block writes is the mma.sync kernel's: with several splits the
// partial (O_s, L_s) of its rows in fp32, merged by the merge kernel, or with
// one split O and L themselves.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/mma_sm80.cuh"
#include "common/reduce.cuh"
#include "common/sm90_layout.h"
#include "common/wgmma_sm90.cuh"
#include "split_kv_device.cuh"

namespace flashstep::split_kv {

namespace {

// The shapes the Hopper kernel fixes (split_kv_plan.h says why each).
constexpr int kD = 128;                                    // the head-dimension bucket it serves
constexpr int kSRegs = kWideKeys / 2;                      // S's fp32 a thread (m64 x n64)
constexpr int kORegs = kD / 2;                             // O~'s fp32 a thread (m64 x n128)
constexpr int kQKSteps = kD / sm90::kWgmmaK;               // k16 steps of Q Kj^T
constexpr int kPVSteps = kWideKeys / sm90::kWgmmaK;        // k16 steps of P~ Vj
constexpr int kChunksPerRow = kD / sm80::kChunkElems;      // 16-byte chunks of a row
// Shared memory: Qi [kWideRows][kD], then kWideStages x (Kj, Vj [kWideKeys][kD]),
// each in the 128-byte swizzle (column blocks of 64 elements), from a
// 1024-byte boundary (the swizzle is computed from address bits).
constexpr int kQBytes = kWideRows * kD * 2;
constexpr int kTileBytes = kWideKeys * kD * 2;
constexpr int kSmemBytes = sm90::kSwizzleAtomBytes + kQBytes + 2 * kWideStages * kTileBytes;
constexpr int kWarpgroups = kWideRows / sm90::kWgmmaM;     // one per 64 rows
static_assert(kWarpgroups * sm90::kWgmmaM == kWideRows &&
                  kWarpgroups * sm90::kWarpgroupThreads == kWideThreads,
              "a warpgroup per m64 of rows");
static_assert(kWideKeys % kPageKeyMultiple == 0 || kPageKeyMultiple % kWideKeys == 0,
              "a paged tile lies inside one page");
static_assert(kSmemBytes <= sm90::kMaxSmemBytesPerBlock, "Q and the K/V stages fit one block");
static_assert(kD % sm90::kSwizzleRowElems == 0, "d is whole column blocks");

// Copies rows [0, rows_valid) x columns [0, d) of a row-major array with d
// columns (d a multiple of 8, 16-byte aligned rows) into a [kTileRows] x kD
// tile in the 128-byte swizzle, zeros elsewhere, by 16-byte cp.async:
// thread k copies chunks k, k + 128, ... (consecutive threads, consecutive
// chunks of a row). The caller commits the group.
template <int kTileRows, typename Elem>
__device__ inline void load_swizzled(unsigned char* tile, const Elem* src, int rows_valid, int d) {
#pragma unroll
  for (int c = threadIdx.x; c < kTileRows * kChunksPerRow; c += kWideThreads) {
    const int row = c / kChunksPerRow, col = c % kChunksPerRow * sm80::kChunkElems;
    const bool in = row < rows_valid && col < d;
    sm80::cp_async_16(tile + sm90::swizzle128_offset(row, col, kTileRows),
                      in ? src + static_cast<std::int64_t>(row) * d + col : src, in);
  }
}

// The same for a whole tile (kTileRows rows, all d = kD columns, a
// contiguous [kTileRows, kD] source): thread k's chunks sit in rows
// k / 16 + 8 j at one column, so they are kTileRows / 8 copies at constant
// offsets from the first, 8 rows (1024 bytes, one swizzle atom) apart in the
// tile and 8 kD elements apart in the source. load_swizzled works out each
// chunk's row, column, bounds and swizzle; in the tile loop those were most
// of the kernel's integer instructions (ncu: the warps issued every third
// cycle, with two a scheduler).
template <int kTileRows, typename Elem>
__device__ inline void load_full_swizzled(unsigned char* tile, const Elem* src) {
  constexpr int kRowsPerPass = kWideThreads / kChunksPerRow;  // whole swizzle atoms
  static_assert(kRowsPerPass % sm90::kSwizzleAtomRows == 0, "a pass is whole swizzle atoms");
  const int row = threadIdx.x / kChunksPerRow, col = threadIdx.x % kChunksPerRow * sm80::kChunkElems;
  unsigned char* to = tile + sm90::swizzle128_offset(row, col, kTileRows);
  const Elem* from = src + row * kD + col;
#pragma unroll
  for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
    sm80::cp_async_16(to + pass * kRowsPerPass * sm90::kSwizzleRowBytes, from + pass * kRowsPerPass * kD,
                      true);
  }
}

// S = Qi Kj^T as one wgmma-group, not waited for: kQKSteps m64n64k16
// reading both through K-major descriptors; k16 step kk lies in column block
// kk / 4, 32 bytes a step into its 128-byte rows (stage 08's issue_qk).
template <typename Elem>
__device__ inline void issue_scores(float (&S)[kSRegs], std::uint32_t q_addr, std::uint32_t k_addr) {
  const std::uint64_t a0 = sm90::make_descriptor(q_addr, 16, sm90::kSwizzleAtomBytes, sm90::Swizzle::k128B);
  const std::uint64_t b0 = sm90::make_descriptor(k_addr, 16, sm90::kSwizzleAtomBytes, sm90::Swizzle::k128B);
#pragma unroll
  for (int kk = 0; kk < kQKSteps; ++kk) {
    const std::uint32_t block = kk / 4, in_row = kk % 4 * 2 * sm90::kWgmmaK;
    const std::uint64_t a = sm90::advance_descriptor(a0, block * kWideRows * sm90::kSwizzleRowBytes + in_row);
    const std::uint64_t b = sm90::advance_descriptor(b0, block * kWideKeys * sm90::kSwizzleRowBytes + in_row);
    sm90::wgmma_m64nNk16_ss<Elem, kWideKeys, 1, 0>(S, a, b, kk > 0);
  }
  sm90::wgmma_commit();
}

// O~ += P~ Vj as one wgmma-group, not waited for: kPVSteps m64n128k16 with
// P~ from registers and Vj read MN-major (the transpose bit): 16 keys = 2048
// bytes a step, the second 64 columns one column block (kWideKeys rows of
// 128 bytes) on (LBO) (stage 08's issue_pv).
template <typename Elem>
__device__ inline void issue_output(float (&O)[kORegs], const std::uint32_t (&a)[kPVSteps][4],
                                    std::uint32_t v_addr) {
  const std::uint64_t b0 = sm90::make_descriptor(v_addr, kWideKeys * sm90::kSwizzleRowBytes,
                                                 sm90::kSwizzleAtomBytes, sm90::Swizzle::k128B);
#pragma unroll
  for (int kk = 0; kk < kPVSteps; ++kk) {
    const std::uint64_t b = sm90::advance_descriptor(b0, kk * sm90::kWgmmaK * sm90::kSwizzleRowBytes);
    sm90::wgmma_m64nNk16_rs<Elem, kD, 1>(O, a[kk], b, 1);
  }
  sm90::wgmma_commit();
}

// Algorithm 1's lines 9-10 up to the product on one tile of raw scores, for
// the thread's rows h = 0 (g) and 1 (g + 8) of its warp: with kMask, keys
// at or past end[h] - key0 set to -inf (only the last tiles of a split need
// it; the others skip the 32 compares and selects), m moved (log2 units),
// P~ in place of S, l rescaled and increased; alpha = 2^(m_old - m_new).
// Returns whether any row of the warp moved its max. With a positive scale
// (kPositive) the max is taken over the raw scores and each exponential is
// one FFMA and one MUFU (2^(s scale - m)), as stage 08's; any other scale
// multiplies each score first (a max of -s is not the max of s). The row
// max and sum are trees (sm90::row_reduce): as chains of 15 they had the
// warps waiting on fixed-latency dependencies a third of their cycles, with
// two warps a scheduler to hide them (docs/results/tuning_09, run 20).
template <bool kPositive, bool kMask>
__device__ inline bool online_softmax(float (&S)[kSRegs], float (&m)[2], float (&l)[2],
                                      float (&alpha)[2], float scale_log2, int key0,
                                      const int (&end)[2]) {
  const int t4 = threadIdx.x % 4;
  const float unit = kPositive ? scale_log2 : 1.0f;  // the scale still to apply
#pragma unroll
  for (int r = 0; r < kSRegs; ++r) {
    if constexpr (!kPositive) S[r] *= scale_log2;
    const int col = 8 * (r / 4) + 2 * t4 + r % 2;  // sm90::accumulator_coord's column
    if (kMask && col >= end[r % 4 / 2] - key0) S[r] = -INFINITY;
  }
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = sm90::row_reduce<true>(S, h);
    mx = fmaxf(mx, __shfl_xor_sync(kFullWarpMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFullWarpMask, mx, 2));
    const float m_new = fmaxf(m[h], mx * unit);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: 2^(-inf - 0) = 0
    alpha[h] = sm80::fast_exp2(m[h] - m_use);
    moved = moved || m_new != m[h];
    m[h] = m_new;
#pragma unroll
    for (int nt = 0; nt < kSRegs / 4; ++nt) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) S[4 * nt + e] = sm80::fast_exp2(fmaf(S[4 * nt + e], unit, -m_use));
    }
    l[h] = alpha[h] * l[h] + sm90::row_reduce<false>(S, h);
  }
  return __any_sync(kFullWarpMask, moved);
}

// P~ as wgmma's A operand: the S registers rounded to Elem, packed in pairs
// (sm90_layout.h's p_source_register).
template <typename Elem>
__device__ inline void pack_p(std::uint32_t (&a)[kPVSteps][4], const float (&S)[kSRegs]) {
#pragma unroll
  for (int kk = 0; kk < kPVSteps; ++kk) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      a[kk][reg] = sm90::pack2<Elem>(S[sm90::p_source_register(kk, reg, 0)],
                                     S[sm90::p_source_register(kk, reg, 1)]);
    }
  }
}

template <bool kPaged, typename Elem>
__global__ void __launch_bounds__(kWideThreads, kWideResidentBlocks)
    split_wgmma_kernel(const Params<Elem> p) {
  extern __shared__ uint4 smem_chunks[];
  unsigned char* raw = reinterpret_cast<unsigned char*>(smem_chunks);
  unsigned char* base =
      raw + (sm90::kSwizzleAtomBytes - sm90::smem_address(raw) % sm90::kSwizzleAtomBytes) %
                sm90::kSwizzleAtomBytes;
  unsigned char* Qs = base;  // Qi [kWideRows][kD], swizzled
  auto Ks = [&](int stage) { return base + kQBytes + 2 * stage * kTileBytes; };  // [kWideKeys][kD]
  auto Vs = [&](int stage) { return Ks(stage) + kTileBytes; };                     // [kWideKeys][kD]
  const int wg = threadIdx.x / sm90::kWarpgroupThreads;
  const int warp = threadIdx.x % sm90::kWarpgroupThreads / kWarpSize;  // in the warpgroup
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t4 = lane % 4;  // accumulator coordinates (sm90::accumulator_coord)
  const std::int64_t units = p.row_tiles * p.splits;
  let_next_kernel_launch();
  wait_for_previous_kernel();  // an append's writes to the cache (a no-op otherwise)

  for (std::int64_t kvh = blockIdx.y; kvh < p.kv_heads; kvh += gridDim.y) {
    const int nk = sequence_keys(p, kvh / p.H_kv);
    const Elem* K = p.K + head_base<kPaged>(p, kvh);  // [Nk, d] of this K/V head, or the pool
    const Elem* V = p.V + head_base<kPaged>(p, kvh);
    const std::int64_t row_base = query_head(kvh, 0, p.H, p.H_kv) * p.Nq;  // the group's row 0
    for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
      // Row tile first: the row tiles of a split are consecutive blocks.
      const std::int64_t s = u / p.row_tiles;
      const std::int64_t r0 = u % p.row_tiles * kWideRows;
      const UnitSpan span = unit_span<kWideKeys>(p, r0, kWideRows, s, nk);
      const int rows = span.rows, k_lo = span.k_lo, k_hi = span.k_hi, tiles = span.tiles;
      // K/V tile tt into its stage, as one cp.async group (empty past the
      // split), so that the waits count tiles.
      // A tile with all its keys in the split and d = kD (every tile but a
      // ragged last one, at d = 128) takes load_full_swizzled.
      const bool full_width = p.d == kD;
      auto issue_tile = [&](int tt) {
        if (tt < tiles) {
          const int kt = k_lo + tt * kWideKeys;
          if (full_width && k_hi - kt >= kWideKeys) {
            const std::int64_t at = tile_offset<kPaged>(p, kvh, kt, kD);
            load_full_swizzled<kWideKeys>(Ks(tt % kWideStages), K + at);
            load_full_swizzled<kWideKeys>(Vs(tt % kWideStages), V + at);
          } else {
            const std::int64_t at = tile_offset<kPaged>(p, kvh, kt, p.d);
            load_swizzled<kWideKeys>(Ks(tt % kWideStages), K + at, k_hi - kt, p.d);
            load_swizzled<kWideKeys>(Vs(tt % kWideStages), V + at, k_hi - kt, p.d);
          }
        }
        sm80::cp_async_commit();
      };
      // This thread's copies have landed but for the `pending` youngest
      // groups; then the block meets, so every thread's have, and every
      // thread is done with what it read before. cp.async writes through the
      // generic proxy and wgmma reads through the async one: hence the fence.
      auto wait_tiles = [&](auto pending) {
        sm80::cp_async_wait<decltype(pending)::value>();
        sm90::fence_proxy_async_shared();
        __syncthreads();
      };

      __syncthreads();  // the previous unit is done with every stage
      load_swizzled<kWideRows>(Qs, p.Q + (row_base + r0) * p.d, rows, p.d);  // with tile 0's group
#pragma unroll
      for (int tt = 0; tt < kWideStages - 1; ++tt) issue_tile(tt);

      // The keys this thread's rows see in the split: [k_lo, end[h]);
      // padding rows (past `rows`: Q zero, never written) the whole split.
      // Tiles that start below `unmasked`, the fewest any row of the warp
      // sees, need no mask.
      const int row0 = wg * sm90::kWgmmaM + 16 * warp + g;  // the thread's row h = 0 in the tile
      int end[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        end[h] = r < rows ? static_cast<int>(min(static_cast<std::int64_t>(k_hi),
                                                 visible_keys((r0 + r) % p.Nq, p.Nq, nk, p.causal)))
                          : k_hi;
      }
      const int unmasked = __reduce_min_sync(kFullWarpMask, min(end[0], end[1]));
      // A warpgroup whose 64 rows are all padding only copies and meets the
      // barriers (warpgroup-uniform, so its wgmma are skipped whole).
      const bool live = wg * sm90::kWgmmaM < rows;
      const std::uint32_t q_addr = sm90::smem_address(Qs) + wg * sm90::kWgmmaM * sm90::kSwizzleRowBytes;

      float O[kORegs];
#pragma unroll
      for (int r = 0; r < kORegs; ++r) O[r] = 0.0f;
      float S[kSRegs];
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
      const bool positive = p.scale_log2 > 0.0f;  // uniform: the branch is taken alike everywhere
      auto scores_softmax = [&](int tt) {  // S of tile tt has landed in the registers
        const int key0 = k_lo + tt * kWideKeys;
        if (unmasked - key0 < kWideKeys) {  // warp-uniform, as `positive`
          return positive ? online_softmax<true, true>(S, m, l, alpha, p.scale_log2, key0, end)
                          : online_softmax<false, true>(S, m, l, alpha, p.scale_log2, key0, end);
        }
        return positive ? online_softmax<true, false>(S, m, l, alpha, p.scale_log2, key0, end)
                        : online_softmax<false, false>(S, m, l, alpha, p.scale_log2, key0, end);
      };

      if (tiles > 0) {
        wait_tiles(std::integral_constant<int, kWideStages - 2>{});  // Qi and tile 0 (group 0)
        if (live) {
          sm90::wgmma_fence();
          issue_scores<Elem>(S, q_addr, sm90::smem_address(Ks(0)));
          sm90::wgmma_wait<0>();
          sm90::fence_accumulators(S);
          scores_softmax(0);  // O~ is zero: nothing to rescale
        }
      }
      // One K/V tile t: P~_t Vt, and with `next` (kNext: a compile-time
      // flag, so that no branch lies between the wgmma of one fenced run,
      // which makes ptxas serialize them, C7520) S_{t+1} and its softmax.
      auto step = [&](int t, auto with_next) {
        constexpr bool kNext = decltype(with_next)::value;
        // Tile t + 1 has landed (groups 0 .. t + kWideStages - 2 are
        // committed); every thread is done with tile t - 1, whose stage takes
        // tile t + kWideStages - 1.
        wait_tiles(std::integral_constant<int, kWideStages - 3>{});
        issue_tile(t + kWideStages - 1);
        if (!live) return;
        std::uint32_t a[kPVSteps][4];
        pack_p<Elem>(a, S);  // before the fence: S_{t+1} overwrites S
        sm90::wgmma_fence();
        if constexpr (kNext) issue_scores<Elem>(S, q_addr, sm90::smem_address(Ks((t + 1) % kWideStages)));
        issue_output<Elem>(O, a, sm90::smem_address(Vs(t % kWideStages)));
        bool moved = false;
        if constexpr (kNext) {
          sm90::wgmma_wait<1>();  // S_{t+1}; P~_t Vt may still run
          sm90::fence_accumulators(S);
          moved = scores_softmax(t + 1);
        }
        sm90::wgmma_wait<0>();
        sm90::fence_accumulators(O);
        if (moved) {
#pragma unroll
          for (int r = 0; r < kORegs; ++r) O[r] *= alpha[r % 4 / 2];
        }
      };
      for (int t = 0; t + 1 < tiles; ++t) step(t, std::true_type{});
      if (tiles > 0) step(tiles - 1, std::false_type{});
      sm80::cp_async_wait<0>();  // the empty groups past the split

      // Lines 12-13 for the thread's rows: l summed over the quad, O = O~ / l
      // and L = (m + log2 l) ln 2, as the partial of split s (fp32) or, with
      // one split, the answer. A row that saw no key: O = 0, L = -inf.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = l[h];
        sum += __shfl_xor_sync(kFullWarpMask, sum, 1);
        sum += __shfl_xor_sync(kFullWarpMask, sum, 2);
        const int r = row0 + 8 * h;
        if (!live || r >= rows) continue;
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        const float L = sum == 0.0f ? -INFINITY : (m[h] + log2f(sum)) * kLn2;
        const std::int64_t row = row_base + r0 + r;  // of O: [B * H * Nq]
        if (p.splits == 1) {
          Elem* o_row = p.O + row * p.d;  // [d]
#pragma unroll
          for (int nt = 0; nt < kORegs / 4; ++nt) {
            const int col = 8 * nt + 2 * t4;
            if (col < p.d) {
              *reinterpret_cast<std::uint32_t*>(o_row + col) =
                  sm90::pack2<Elem>(O[4 * nt + 2 * h] * inv, O[4 * nt + 2 * h + 1] * inv);
            }
          }
          if (t4 == 0) p.L[row] = L;
        } else {
          float* o_row = p.O_part + (s * p.heads * p.Nq + row) * p.d;  // [d], partials stay fp32
#pragma unroll
          for (int nt = 0; nt < kORegs / 4; ++nt) {
            const int col = 8 * nt + 2 * t4;
            if (col < p.d) {
              *reinterpret_cast<float2*>(o_row + col) =
                  make_float2(O[4 * nt + 2 * h] * inv, O[4 * nt + 2 * h + 1] * inv);
            }
          }
          if (t4 == 0) p.L_part[s * p.heads * p.Nq + row] = L;
        }
      }
    }
  }
}

}  // namespace

bool device_takes_wgmma() {
  int device = 0, major = 0, minor = 0;
  cuda_check(cudaGetDevice(&device), "stage 09: cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "stage 09: compute capability");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "stage 09: compute capability");
  return major == 9 && minor == 0;  // sm_90a code runs on sm_90 alone
}

template <typename Elem>
void launch_split_wgmma(const Params<Elem>& prm, Stream stream) {
  const dim3 grid(static_cast<unsigned>(std::min(prm.row_tiles * prm.splits, kMaxGridX)),
                  static_cast<unsigned>(std::min(prm.kv_heads, kMaxGridY)));
  const auto kernel = prm.cache.block_table ? split_wgmma_kernel<true, Elem>
                                            : split_wgmma_kernel<false, Elem>;
  launch_dependent(kernel, grid, kWideThreads, kSmemBytes, stream, "stage 09 split_wgmma_kernel",
                   prm, prm.new_keys > 0);
}

int wgmma_occupancy() {
  const auto kernel = split_wgmma_kernel<false, __nv_bfloat16>;
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
             "stage 09: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  int blocks = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWideThreads, kSmemBytes),
             "stage 09: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

template void launch_split_wgmma<__half>(const Params<__half>&, Stream);
template void launch_split_wgmma<__nv_bfloat16>(const Params<__nv_bfloat16>&, Stream);

}  // namespace flashstep::split_kv
