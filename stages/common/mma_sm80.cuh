/// \file mma_sm80.cuh
/// \brief The Ampere (sm_80) tensor-core and copy instructions the tensor-core
/// stages use, each wrapped in one small named helper with the PTX ISA section
/// it implements. Device code: include it from .cu files only. Also runs on
/// sm_90 (Hopper keeps every one of these instructions).
///
/// Section names are those of NVIDIA's "Parallel Thread Execution ISA"
/// (PTX ISA 9.0), chapter "Instruction Set".
///
/// The fragments of `mma.sync.aligned.m16n8k16` (16-bit A and B, fp32
/// accumulators), section "Matrix Fragments for mma.m16n8k16 with floating
/// point type". A warp's 32 lanes form 8 groups of 4: g = lane / 4 (the
/// "groupID") and t = lane % 4 (the "threadID_in_group"). Each 32-bit
/// register holds two 16-bit elements, the lower column (or k) in the low half.
///
///   A, 16 x 16 (rows m, columns k), row-major, 4 registers a0..a3:
///
///              k = 0..7          k = 8..15
///            +-----------------+-----------------+
///   m = 0..7 | a0: (g, 2t..2t+1) | a2: (g, 8+2t..) |
///            +-----------------+-----------------+
///   m = 8..15| a1: (8+g, 2t..)   | a3: (8+g, 8+2t..)|
///            +-----------------+-----------------+
///
///   B, 16 x 8 (rows k, columns n), "col" layout: 2 registers b0, b1:
///     b0 holds (k = 2t, 2t+1;   n = g)
///     b1 holds (k = 8+2t, 9+2t; n = g)
///   so a lane's pair is two consecutive k of one column n: for S = Q K^T,
///   where B[k][n] = K[n][k], that is two neighbouring elements of one row of
///   K, which a plain (non-transposing) ldmatrix delivers.
///
///   C and D, 16 x 8 fp32, 4 registers c0..c3:
///     c0, c1: (row g,     columns 2t, 2t+1)
///     c2, c3: (row 8 + g, columns 2t, 2t+1)
///
/// The C layout of two neighbouring n8 tiles is, element for element, the A
/// layout of one 16 x 16 tile (c0,c1 of tile 0 = a0; c2,c3 of tile 0 = a1;
/// c0,c1 of tile 1 = a2; c2,c3 of tile 1 = a3). That is why the scores S,
/// once turned into P and rounded to 16 bits, can be fed straight back into
/// the next product P V from registers (FlashAttention-2's register trick).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashstep::sm80 {

/// Bytes one cp.async or one ldmatrix row moves: 8 16-bit elements.
inline constexpr int kChunkBytes = 16;
/// 16-bit elements in one 16-byte chunk.
inline constexpr int kChunkElems = 8;

/// The 32-bit shared-memory address of a generic pointer into shared memory,
/// as the ldmatrix and cp.async operands want it.
__device__ inline std::uint32_t smem_address(const void* ptr) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

/// D += A B on the tensor cores: one 16 x 8 x 16 product of a warp
/// (section "Warp-level matrix multiply-accumulate instructions: mma").
/// `Elem` is __nv_bfloat16 or __half; A and B hold Elem pairs, D is fp32.
template <typename Elem>
__device__ inline void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4],
                                    const std::uint32_t (&b)[2]);

template <>
__device__ inline void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4],
                                                   const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ inline void mma_m16n8k16<__half>(float (&d)[4], const std::uint32_t (&a)[4],
                                            const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// Loads four 8 x 8 matrices of 16-bit elements from shared memory, one
/// register each (section "Data Movement and Conversion Instructions:
/// ldmatrix"). Lanes 8i .. 8i+7 give the addresses of the 8 rows (16 bytes
/// each) of matrix i; afterwards lane L holds, in r[i], row L / 4, columns
/// 2 (L % 4) and 2 (L % 4) + 1 of matrix i: exactly one A or B fragment
/// register of mma.m16n8k16 (picture above).
__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row_address)));
}

/// ldmatrix with `.trans`: each 8 x 8 matrix arrives transposed, so lane L
/// holds rows 2 (L % 4) and 2 (L % 4) + 1 of column L / 4. For O += P V,
/// where B[k][n] = V[k][n] sits in shared memory with k (the key) along rows,
/// this hands each lane the two neighbouring keys of one column that the B
/// fragment wants.
__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row_address)));
}

/// Starts an asynchronous 16-byte copy from global to shared memory that
/// bypasses the registers and L1 (section "Data Movement and Conversion
/// Instructions: cp.async", `.cg`). With `valid` false it reads nothing and
/// writes 16 zero bytes (the src-size operand 0): how tiles are zero-padded
/// past the end of a sequence without a branch around the copy.
__device__ inline void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? kChunkBytes : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src), "n"(kChunkBytes), "r"(src_bytes));
}

/// The 4-byte form (`.ca`: copies under 16 bytes go through L1), for rows of
/// fp32 scalars that are 4-byte aligned but not 16: the value lands in shared
/// memory without passing through a register, so the thread does not wait
/// for the load to store it (a plain load and store would stall the warp on
/// the load's latency at that point).
__device__ inline void cp_async_4(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src));
}

/// Closes the group of cp.async copies this thread started since the last
/// commit (section "cp.async.commit_group").
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `kPending` of this thread's committed groups are still
/// in flight (section "cp.async.wait_group"). Other threads' copies become
/// visible only after a barrier that follows each thread's wait.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

/// 2^x in one MUFU.EX2 instruction (section "Floating Point Instructions:
/// ex2", `.approx.ftz`). Plain exp2f adds a compare and two multiplies around
/// it to keep results below 2^-126 exact (denormals); the softmax has no use
/// for them (P~ is rounded to 16 bits next), and at 64 exponentials per lane
/// per K/V tile those three instructions are a tenth of the loop's issue slots.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Two fp32 values rounded (to nearest even) into one register of two
/// 16-bit elements, `lo` in the low half: the A-fragment form of P.
template <typename Elem>
__device__ inline std::uint32_t pack2(float lo, float hi);

template <>
__device__ inline std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

template <>
__device__ inline std::uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

}  // namespace flashstep::sm80
