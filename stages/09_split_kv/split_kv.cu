// Stage 09: split-KV decoding (flash-decoding) on CUDA cores: Q, K, V and O
// in fp32, fp16 or bf16, every sum in fp32.
//
// What changed since stage 05 (and why a new stage): decoding asks for Nq = 1
// to 16 queries against Nk = thousands to a million keys. Stage 05 spreads Q
// blocks over thread blocks; here there is one Q block per head, so it would
// launch B * H blocks, a few dozen on a GPU that holds hundreds, each walking
// all Nk keys. The time is set by reading K and V once, and that takes every
// SM's share of the memory bandwidth. So the keys are spread instead:
//
//   split kernel   grid x = row tiles x splits, grid y = B * H_kv
//                  block (tile, s, kvh): the group's rows r0 .. r0 + 31 (query
//                  head g, query i; r = g Nq + i) against keys
//                  [s kps, (s + 1) kps), Algorithm 1's loop over K/V tiles of
//                  32 keys; writes O_s = O~ / l and L_s = m + log l per row
//   merge kernel   one warp per row: L = logsumexp over s of L_s, then
//                  O = sum over s of exp(L_s - L) O_s (common/partial_merge.h)
//
// Grouped-query heads: the G = H / H_kv query heads that share K/V head kvh
// are rows of the same block, so a K/V tile loaded into shared memory serves
// all of them (K/V read once per group, not once per query head).
//
// Thread layout (256 threads, 8 warps), per K/V tile of 32 keys:
//   scores and softmax   warp w owns rows w, w + 8, w + 16, w + 24; lane j
//                        computes the score of key j: the row max and sum are
//                        one warp shuffle reduction each, m and l live in the
//                        warp's registers
//   O~ += P~ V           thread t owns O~ elements t + 256 k (row e / D,
//                        column e % D): consecutive lanes, consecutive columns
// The next K/V tile arrives by cp.async while this one is computed (two
// buffers up to d = 128, one at d = 256: stages_for).
//
// Run it: ./build/stages/cli/flashstep --stage 09 --B 1 --H 32 --H-kv 8 --Nq 1 --Nk 32768 --d 128
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/element.cuh"
#include "common/error.h"
#include "common/launch.cuh"
#include "common/mma_sm80.cuh"
#include "common/partial_merge.h"
#include "common/reduce.cuh"
#include "split_kv.h"

namespace flashstep::split_kv {

namespace {

// log2(e) and ln(2): scores in log2 units, so each exponential is one exp2.
constexpr double kLog2e = 1.4426950408889634;
constexpr float kLn2 = 0.6931471805599453f;

// Elem: float, __half or __nv_bfloat16 (common/element.cuh).
template <typename Elem>
struct Params {
  const Elem* Q;        // [B, H, Nq, d]
  const Elem* K;        // [B, H_kv, Nk, d]
  const Elem* V;        // [B, H_kv, Nk, d]
  Elem* O;              // [B, H, Nq, d]
  float* L;             // [B, H, Nq]
  float* O_part;        // [splits, B * H, Nq, d], with splits > 1
  float* L_part;        // [splits, B * H, Nq], with splits > 1
  const std::int32_t* seqlens;  // [B] keys of each sequence (KV cache), or null: Nk each
  std::int64_t H, H_kv;
  std::int64_t kv_heads;  // B * H_kv
  std::int64_t heads;     // B * H
  int Nq, Nk, d;
  std::int64_t group_rows, row_tiles, splits, keys_per_split;
  float scale_log2;  // softmax scale * log2(e); any sign: each score is scaled, not the max
  bool causal;
  bool vec;  // 16-byte rows (d * sizeof(Elem) % 16 == 0), aligned tensors: K/V by 16-byte cp.async
};

// K/V tiles in flight: 2 (the next tile's copies run while this one is
// computed) up to d = 128; at d = 256 two stages would need 165 KiB of shared
// memory, more than an sm_80 block may have (163 KiB), so one.
constexpr int stages_for(int kD) { return kD <= 128 ? 2 : 1; }

// Shared memory of the split kernel for the head-dimension bucket kD (d is
// zero-padded up to it): byte offsets, each a multiple of 16. Q, P~ and the
// row statistics are fp32; the K and V tiles stay in Elem as they arrive by
// cp.async, widened where they are read.
template <int kD, typename Elem>
struct Smem {
  static constexpr int kStages = stages_for(kD);
  static constexpr int kChunk = 16 / sizeof(Elem);  // elements of one 16-byte cp.async
  // K rows padded by one chunk: in the score loop lane j reads K[j][c .. c+3]
  // as one access, and the padding moves each lane's row to other banks (in
  // fp32 the 8 lanes of each quarter-warp phase of a 16-byte access hit 8
  // different bank groups; in 16 bits two lanes of a half-warp share one);
  // rows stay 16-byte aligned for cp.async.
  static constexpr int kKStride = kD + kChunk;
  static constexpr std::size_t kQ = 0;                                      // float Qs [kRows][kD]
  static constexpr std::size_t kK = kQ + sizeof(float) * kRows * kD;        // Elem Ks [kStages][kBc][kKStride]
  static constexpr std::size_t kV = kK + sizeof(Elem) * kStages * kBc * kKStride;  // Elem Vs [kStages][kBc][kD]
  static constexpr std::size_t kP = kV + sizeof(Elem) * kStages * kBc * kD;  // float Ps [kRows][kBc]
  static constexpr std::size_t kAlpha = kP + sizeof(float) * kRows * kBc;   // float [kRows]: this tile's rescale
  static constexpr std::size_t kM = kAlpha + sizeof(float) * kRows;         // float [kRows], published at the end
  static constexpr std::size_t kL = kM + sizeof(float) * kRows;             // float [kRows], published at the end
  static constexpr std::size_t kBytes = kL + sizeof(float) * kRows;
};

// Rows a warp owns in the softmax.
constexpr int kRowsPerWarp = kRows / kWarps;
// At least two blocks per SM up to d = 128 (at most 128 registers a
// thread): while one block waits on its K/V tile loads, the other computes.
// Without the bound the compiler takes 178 registers at d = 128, one block
// per SM. At d = 256 the 32 accumulators a thread holds need more: one block.
constexpr int min_blocks_per_sm(int kD) { return kD <= 128 ? 2 : 1; }

// Starts the copies of the K and V tile of keys kt .. kt + kBc - 1 into the
// buffers Ks [kBc][kKStride] and Vs [kBc][kD]: 16-byte cp.async chunks with
// p.vec, else element by element through registers. Keys past k_hi and columns past d are zero: a zero V row
// times a zero P~ adds nothing (stale data there could be NaN).
template <int kD, typename Elem>
__device__ void load_kv_tile(const Params<Elem>& p, const Elem* K, const Elem* V, int kt, int k_hi,
                             Elem* Ks, Elem* Vs) {
  using S = Smem<kD, Elem>;
  const Elem* Kt = K + static_cast<std::int64_t>(kt) * p.d;  // [keys, d]: contiguous
  const Elem* Vt = V + static_cast<std::int64_t>(kt) * p.d;
  const int keys = min(kBc, k_hi - kt);
  if (p.vec) {
    constexpr int kChunks = kD / S::kChunk;  // 16-byte chunks a row
    for (int e = threadIdx.x; e < kBc * kChunks; e += kThreads) {
      const int j = e / kChunks, c = (e % kChunks) * S::kChunk;
      const bool in = j < keys && c < p.d;  // d a multiple of kChunk: a chunk is wholly in or out
      sm80::cp_async_16(Ks + j * S::kKStride + c, in ? Kt + j * p.d + c : Kt, in);
      sm80::cp_async_16(Vs + j * kD + c, in ? Vt + j * p.d + c : Vt, in);
    }
  } else {
    for (int e = threadIdx.x; e < kBc * kD; e += kThreads) {
      const int j = e / kD, c = e % kD;
      const bool in = j < keys && c < p.d;
      Ks[j * S::kKStride + c] = in ? Kt[j * p.d + c] : from_float<Elem>(0.0f);
      Vs[j * kD + c] = in ? Vt[j * p.d + c] : from_float<Elem>(0.0f);
    }
  }
}

template <int kD, typename Elem>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kD))
    split_kernel(const Params<Elem> p) {
  using S = Smem<kD, Elem>;
  constexpr int kOwn = kRows * kD / kThreads;  // O~ elements per thread
  constexpr int kStages = S::kStages;
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for cp.async and float4 reads
  char* smem = reinterpret_cast<char*>(smem_vec);
  float* Qs = reinterpret_cast<float*>(smem + S::kQ);
  Elem* Ks = reinterpret_cast<Elem*>(smem + S::kK);
  Elem* Vs = reinterpret_cast<Elem*>(smem + S::kV);
  float* Ps = reinterpret_cast<float*>(smem + S::kP);
  float* alpha_s = reinterpret_cast<float*>(smem + S::kAlpha);
  float* m_s = reinterpret_cast<float*>(smem + S::kM);
  float* l_s = reinterpret_cast<float*>(smem + S::kL);
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const std::int64_t units = p.row_tiles * p.splits;

  for (std::int64_t kvh = blockIdx.y; kvh < p.kv_heads; kvh += gridDim.y) {
    const std::int64_t b = kvh / p.H_kv;
    // The sequence's keys: its cache length (clamped to the cache, so no read
    // leaves it), or all Nk.
    const int nk = p.seqlens ? min(max(p.seqlens[b], 0), p.Nk) : p.Nk;
    const Elem* K = p.K + kvh * p.Nk * p.d;  // [Nk, d] of this K/V head
    const Elem* V = p.V + kvh * p.Nk * p.d;  // [Nk, d] of this K/V head
    for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
      const std::int64_t tile = u / p.splits;
      const std::int64_t s = u % p.splits;
      const std::int64_t r0 = tile * kRows;
      const int rows = static_cast<int>(min(static_cast<std::int64_t>(kRows), p.group_rows - r0));
      // This split's keys, k_lo .. k_hi - 1: 32-bit, as Nk < 2^31.
      const int k_lo = static_cast<int>(s * p.keys_per_split);
      const int k_hi = static_cast<int>(min(k_lo + p.keys_per_split, static_cast<std::int64_t>(nk)));
      const int tiles = k_hi > k_lo ? (k_hi - k_lo - 1) / kBc + 1 : 0;

      __syncthreads();  // the previous unit is done with every shared array
      // The first kStages - 1 K/V tiles start on their way, then the Q rows
      // of the tile, zero past `rows` and past d, are loaded beside them.
      for (int t = 0; t < kStages - 1; ++t) {
        if (t < tiles) {
          load_kv_tile<kD, Elem>(p, K, V, k_lo + t * kBc, k_hi, Ks + t * kBc * S::kKStride,
                                 Vs + t * kBc * kD);
        }
        sm80::cp_async_commit();
      }
      for (int e = tid; e < kRows * kD; e += kThreads) {
        const int r = e / kD, c = e % kD;
        float q = 0.0f;
        if (r < rows && c < p.d) {
          const std::int64_t rr = r0 + r;
          const std::int64_t bh = query_head(kvh, rr / p.Nq, p.H, p.H_kv);
          q = to_float(p.Q[(bh * p.Nq + rr % p.Nq) * p.d + c]);
        }
        Qs[e] = q;
      }
      // The warp's rows: m and l (Algorithm 1's m_i, l_i, identical in every
      // lane) and the keys each may see in this split.
      float m_row[kRowsPerWarp], l_row[kRowsPerWarp];
      int end_row[kRowsPerWarp];
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        const int r = warp + kWarps * k;
        m_row[k] = -INFINITY;
        l_row[k] = 0.0f;
        end_row[k] = r < rows ? static_cast<int>(min(static_cast<std::int64_t>(k_hi),
                                                     visible_keys((r0 + r) % p.Nq, p.Nq, nk, p.causal)))
                              : k_lo;
      }
      float acc[kOwn];  // O~, unnormalized
#pragma unroll
      for (int k = 0; k < kOwn; ++k) acc[k] = 0.0f;

      for (int t = 0; t < tiles; ++t) {
        // Tile t + kStages - 1 starts into the buffer tile t - 1 used (every
        // thread finished with it at the barrier that ended that iteration);
        // then this thread waits for its copies of tile t, and the barrier
        // makes everyone's visible.
        const int ahead = t + kStages - 1;
        if (ahead < tiles) {
          const int buf = ahead % kStages;
          load_kv_tile<kD, Elem>(p, K, V, k_lo + ahead * kBc, k_hi, Ks + buf * kBc * S::kKStride,
                                 Vs + buf * kBc * kD);
        }
        sm80::cp_async_commit();
        sm80::cp_async_wait<kStages - 1>();
        __syncthreads();
        const int kt = k_lo + t * kBc;
        const Elem* Kb = Ks + (t % kStages) * kBc * S::kKStride;  // [kBc][kKStride]
        const Elem* Vb = Vs + (t % kStages) * kBc * kD;           // [kBc][kD]
        // S = scale Q K^T for the warp's rows, lane = key; the online softmax.
        // (The arrays stay in registers only if every index is a constant:
        // the loops over k are unrolled, rows past `rows` skipped, not left.)
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) {
          const int r = warp + kWarps * k;
          if (r >= rows) continue;  // warp-uniform
          float score = -INFINITY;  // a key the row may not see
          if (kt + lane < end_row[k]) {
            const float4* q4 = reinterpret_cast<const float4*>(Qs + r * kD);
            const Elem* k_row = Kb + lane * S::kKStride;
            float dot = 0.0f;
#pragma unroll 4
            for (int c = 0; c < kD / 4; ++c) {
              const float4 a = q4[c], b4 = load_vec4(k_row + 4 * c);  // widened to fp32
              dot += a.x * b4.x;
              dot += a.y * b4.y;
              dot += a.z * b4.z;
              dot += a.w * b4.w;
            }
            score = dot * p.scale_log2;
          }
          const float m_new = fmaxf(m_row[k], warp_reduce(score, MaxOp{}));
          // No key seen yet: subtract 0, so exp2(-inf - 0) = 0, not exp2(NaN).
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;
          const float p_ij = exp2f(score - m_use);
          const float alpha = exp2f(m_row[k] - m_use);
          l_row[k] = l_row[k] * alpha + warp_reduce(p_ij, SumOp{});
          m_row[k] = m_new;
          Ps[r * kBc + lane] = p_ij;
          if (lane == 0) alpha_s[r] = alpha;
        }
        __syncthreads();
        // O~ = alpha O~ + P~ V for the thread's elements.
#pragma unroll
        for (int k = 0; k < kOwn; ++k) {
          const int e = tid + kThreads * k;
          const int r = e / kD, c = e % kD;
          if (r >= rows) continue;
          float o = acc[k] * alpha_s[r];
#pragma unroll 8
          for (int j = 0; j < kBc; ++j) o += Ps[r * kBc + j] * to_float(Vb[j * kD + c]);
          acc[k] = o;
        }
        __syncthreads();  // Ps, alpha and this tile's buffer are free again
      }

#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        const int r = warp + kWarps * k;
        if (lane == 0) {
          m_s[r] = m_row[k];
          l_s[r] = l_row[k];
        }
      }
      __syncthreads();
      // O_s = O~ / l and L_s = m + log l (natural log): the partial of this
      // split, or with one split the answer. A row that saw no key has l = 0:
      // O = 0, L = -inf. (l NaN, from NaN inputs, stays NaN.)
#pragma unroll
      for (int k = 0; k < kOwn; ++k) {
        const int e = tid + kThreads * k;
        const int r = e / kD, c = e % kD;
        if (r >= rows || c >= p.d) continue;
        const std::int64_t rr = r0 + r;
        const std::int64_t row = query_head(kvh, rr / p.Nq, p.H, p.H_kv) * p.Nq + rr % p.Nq;
        const float o = l_s[r] == 0.0f ? 0.0f : acc[k] / l_s[r];
        if (p.splits == 1) p.O[row * p.d + c] = from_float<Elem>(o);
        else p.O_part[((s * p.heads * p.Nq) + row) * p.d + c] = o;  // partials stay fp32
      }
      if (tid < rows) {
        const std::int64_t rr = r0 + tid;
        const std::int64_t row = query_head(kvh, rr / p.Nq, p.H, p.H_kv) * p.Nq + rr % p.Nq;
        const float L = l_s[tid] == 0.0f ? -INFINITY : (m_s[tid] + log2f(l_s[tid])) * kLn2;
        if (p.splits == 1) p.L[row] = L;
        else p.L_part[s * p.heads * p.Nq + row] = L;
      }
    }
  }
}

// One warp per row of O: L = logsumexp of the partials' L_s, then
// O = sum_s exp(L_s - L) O_s, rounded to Elem once.
template <typename Elem>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const Params<Elem> p) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const std::int64_t rows = p.heads * p.Nq;
  for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kMergeRows) + warp; row < rows;
       row += static_cast<std::int64_t>(gridDim.x) * kMergeRows) {
    float L = -INFINITY;
    for (std::int64_t s = 0; s < p.splits; ++s) L = lse_merge(L, p.L_part[s * rows + row]);
    for (int c = lane; c < p.d; c += kWarpSize) {
      float o = 0.0f;
      for (std::int64_t s = 0; s < p.splits; ++s) {
        o += partial_weight(p.L_part[s * rows + row], L) * p.O_part[(s * rows + row) * p.d + c];
      }
      p.O[row * p.d + c] = from_float<Elem>(o);
    }
    if (lane == 0) p.L[row] = L;
  }
}

int device_sm_count() {
  int device = 0, sms = 0;
  cuda_check(cudaGetDevice(&device), "stage 09: cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "stage 09: SM count");
  return sms;
}

template <int kD, typename Elem>
void launch_split(const Params<Elem>& prm, Stream stream) {
  const dim3 grid(static_cast<unsigned>(std::min(prm.row_tiles * prm.splits, kMaxGridX)),
                  static_cast<unsigned>(std::min(prm.kv_heads, kMaxGridY)));
  launch_with_smem(split_kernel<kD, Elem>, grid, kThreads, Smem<kD, Elem>::kBytes, stream,
                   "stage 09 split_kernel", prm);
}

template <typename Elem>
void launch(const Problem& p, const ForwardTensors& t, const Plan& plan,
            const std::int32_t* seqlens, Stream stream) {
  Params<Elem> prm{};
  prm.Q = static_cast<const Elem*>(t.Q);
  prm.K = static_cast<const Elem*>(t.K);
  prm.V = static_cast<const Elem*>(t.V);
  prm.O = static_cast<Elem*>(t.O);
  prm.L = t.L;
  prm.O_part = static_cast<float*>(t.workspace);
  prm.L_part = plan.splits > 1 ? prm.O_part + plan.splits * p.q_elems() : nullptr;
  prm.seqlens = seqlens;
  prm.H = p.H;
  prm.H_kv = p.kv_heads();
  prm.kv_heads = p.B * p.kv_heads();
  prm.heads = p.heads();
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.group_rows = plan.group_rows;
  prm.row_tiles = plan.row_tiles;
  prm.splits = plan.splits;
  prm.keys_per_split = plan.keys_per_split;
  prm.scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  prm.causal = p.causal;
  prm.vec = float4_ok(p, t);
  switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
    case 64: launch_split<64>(prm, stream); break;
    case 128: launch_split<128>(prm, stream); break;
    default: launch_split<256>(prm, stream); break;
  }
  if (plan.splits > 1) {
    const std::int64_t blocks = (p.heads() * p.Nq - 1) / kMergeRows + 1;
    merge_kernel<Elem><<<static_cast<unsigned>(std::min(blocks, kMaxGridX)), kMergeThreads, 0,
                         stream>>>(prm);
    check_launch("stage 09 merge_kernel");
  }
}

void run(const Problem& p, const ForwardTensors& t, const std::int32_t* seqlens, Stream stream,
         bool split) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 09: null tensor pointer");
  const Plan plan = make_plan(p, device_sm_count(), split);
  if (plan.splits > 1 && !t.workspace) throw Error("stage 09: null workspace with several splits");
  with_element_type(p.dtype, [&](auto elem) {
    launch<decltype(elem)>(p, t, plan, seqlens, stream);
  });
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  run(p, t, nullptr, stream, true);
}

void forward_one_block(const Problem& p, const ForwardTensors& t, Stream stream) {
  run(p, t, nullptr, stream, false);
}

void forward_kvcache(const Problem& p, const ForwardTensors& t, const std::int32_t* cache_seqlens,
                     Stream stream, bool split) {
  if (!cache_seqlens) throw Error("stage 09: null cache_seqlens");
  run(p, t, cache_seqlens, stream, split);
}

}  // namespace flashstep::split_kv
