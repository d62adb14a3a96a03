/// \file wgmma_sm90.cuh
/// \brief The Hopper (sm_90a) instructions stage 08 uses, each wrapped in one
/// small named helper with the PTX ISA section it implements and what its
/// operands mean. Device code for sm_90a only: include it from .cu files
/// compiled with -gencode=arch=compute_90a,code=sm_90a.
///
/// Section names are those of NVIDIA's "Parallel Thread Execution ISA"
/// (PTX ISA 9.0). The layouts the instructions assume (accumulator and A
/// fragments, the 128-byte swizzle, the matrix descriptor) are in
/// common/sm90_layout.h, as plain arithmetic the CPU tests check against the
/// ISA's figures.
///
/// The asynchronous tensor-core protocol (section "Asynchronous Warpgroup
/// Level Matrix Multiply-Accumulate Operation using wgmma.mma_async"):
///
///   wgmma_fence()            registers (accumulators, A) written before are
///                            now visible to the wgmmas below
///   wgmma_...(acc, ...)      k16 step 0     -+
///   wgmma_...(acc, ...)      k16 step 1      | issued, not yet done
///   ...                                     -+
///   wgmma_commit()           the wgmmas so far become one group
///   wgmma_wait<N>()          block until at most N groups are in flight;
///                            only then may acc be read, or their shared
///                            memory overwritten
///
/// The accumulators are asm outputs the compiler must not move across the
/// fence, commit and wait: fence_accumulators() pins them (an empty asm that
/// "reads and writes" each one), as CUTLASS's warpgroup_fence_operand does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "sm90_layout.h"

namespace flashstep::sm90 {

/// The 32-bit shared-memory address of a generic pointer into shared memory,
/// as descriptors, mbarriers and the bulk copies want it.
__device__ inline std::uint32_t smem_address(const void* ptr) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---------------------------------------------------------------------------
// wgmma: warpgroup matrix multiply-accumulate.

/// wgmma.fence.sync.aligned, section "wgmma.fence": orders this warpgroup's
/// earlier register writes (of accumulators and of A in registers) before
/// the wgmma.mma_async that follow. Needed before the first wgmma of a chain
/// and whenever the registers were touched in between (softmax on S, the
/// rescale of O).
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

/// wgmma.commit_group.sync.aligned, section "wgmma.commit_group": closes the
/// wgmma.mma_async issued since the last commit into one wgmma-group.
__device__ inline void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/// wgmma.wait_group.sync.aligned N, section "wgmma.wait_group": waits until
/// at most N of this warpgroup's wgmma-groups are pending. N = 0: every
/// product is in the accumulators and the shared memory they read is free.
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// Keeps the compiler from moving reads or writes of `acc` across the
/// asynchronous wgmma protocol (no instruction emitted).
template <int kRegs>
__device__ inline void fence_accumulators(float (&acc)[kRegs]) {
#pragma unroll
  for (int r = 0; r < kRegs; ++r) asm volatile("" : "+f"(acc[r])::"memory");
}

/// The PTX type name of a 16-bit element type in a wgmma.
template <typename Elem>
struct WgmmaType;
template <>
struct WgmmaType<__nv_bfloat16> {
  static constexpr const char* kName = "bf16";
};
template <>
struct WgmmaType<__half> {
  static constexpr const char* kName = "f16";
};

// The 32 accumulator operands of an m64n64 fp32 wgmma, "+f"(acc[0]) ..
// "+f"(acc[31]), and their placeholders %0 .. %31 in the instruction.
#define FLASHSTEP_ACC32(a)                                                                    \
  "+f"(a[0]), "+f"(a[1]), "+f"(a[2]), "+f"(a[3]), "+f"(a[4]), "+f"(a[5]), "+f"(a[6]),       \
      "+f"(a[7]), "+f"(a[8]), "+f"(a[9]), "+f"(a[10]), "+f"(a[11]), "+f"(a[12]), "+f"(a[13]), \
      "+f"(a[14]), "+f"(a[15]), "+f"(a[16]), "+f"(a[17]), "+f"(a[18]), "+f"(a[19]),           \
      "+f"(a[20]), "+f"(a[21]), "+f"(a[22]), "+f"(a[23]), "+f"(a[24]), "+f"(a[25]),           \
      "+f"(a[26]), "+f"(a[27]), "+f"(a[28]), "+f"(a[29]), "+f"(a[30]), "+f"(a[31])
#define FLASHSTEP_ACC32_PLACES                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

/// wgmma.mma_async.sync.aligned.m64n64k16.f32.{bf16,f16}.{bf16,f16} with A
/// and B in shared memory, section "wgmma.mma_async":
///   acc (m64 x n64 fp32, sm90_layout.h's accumulator_coord) +=
///       kScaleA A (m64 x k16) * B (k16 x n64)
/// - desc_a, desc_b: matrix descriptors (make_descriptor) of A, K-major
///   (k contiguous), and of B: K-major when kTransposeB = 0 (B's n rows each
///   hold 16 contiguous k, as K's rows do for S = Q K^T), MN-major when 1
///   (B's k rows each hold contiguous n, as V's rows do for O = P V).
/// - accumulate: 0 to overwrite acc (scale-d = 0: acc = A B), 1 to add.
/// - kScaleA: 1 or -1, the instruction's imm-scale-a (negates A for free:
///   stage 08 runs a negative softmax scale as |scale| on -Q so).
template <typename Elem, int kScaleA, int kTransposeB>
__device__ inline void wgmma_m64n64k16_ss(float (&acc)[32], std::uint64_t desc_a,
                                          std::uint64_t desc_b, int accumulate) {
  static_assert(kScaleA == 1 || kScaleA == -1, "imm-scale-a is 1 or -1");
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FLASHSTEP_ACC32_PLACES
        ", %32, %33, p, %35, 1, 0, %36;\n}\n"
        : FLASHSTEP_ACC32(acc)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kScaleA), "n"(kTransposeB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FLASHSTEP_ACC32_PLACES
        ", %32, %33, p, %35, 1, 0, %36;\n}\n"
        : FLASHSTEP_ACC32(acc)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kScaleA), "n"(kTransposeB));
  }
}

/// The same with A in registers (section "wgmma.mma_async", the `a` operand
/// as a vector of four .b32): a[0..3] hold this thread's 8 elements of the
/// m64 x k16 A tile, two per register, as sm90_layout.h's a_register_coord
/// places them. Stage 08 passes P~ so, straight from the S accumulators
/// (p_source_register): P never touches shared memory.
/// There is no transpose for an A in registers; B as above.
template <typename Elem, int kTransposeB>
__device__ inline void wgmma_m64n64k16_rs(float (&acc)[32], const std::uint32_t (&a)[4],
                                          std::uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FLASHSTEP_ACC32_PLACES
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : FLASHSTEP_ACC32(acc)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate),
          "n"(kTransposeB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FLASHSTEP_ACC32_PLACES
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : FLASHSTEP_ACC32(acc)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate),
          "n"(kTransposeB));
  }
}

// The 64 accumulator operands of an m64n128 fp32 wgmma, and %0 .. %63.
#define FLASHSTEP_ACC64(a) \
  "+f"(a[0]), "+f"(a[1]), "+f"(a[2]), "+f"(a[3]), "+f"(a[4]), "+f"(a[5]), "+f"(a[6]), \
  "+f"(a[7]), "+f"(a[8]), "+f"(a[9]), "+f"(a[10]), "+f"(a[11]), "+f"(a[12]), "+f"(a[13]), \
  "+f"(a[14]), "+f"(a[15]), "+f"(a[16]), "+f"(a[17]), "+f"(a[18]), "+f"(a[19]), \
  "+f"(a[20]), "+f"(a[21]), "+f"(a[22]), "+f"(a[23]), "+f"(a[24]), "+f"(a[25]), \
  "+f"(a[26]), "+f"(a[27]), "+f"(a[28]), "+f"(a[29]), "+f"(a[30]), "+f"(a[31]), \
  "+f"(a[32]), "+f"(a[33]), "+f"(a[34]), "+f"(a[35]), "+f"(a[36]), "+f"(a[37]), \
  "+f"(a[38]), "+f"(a[39]), "+f"(a[40]), "+f"(a[41]), "+f"(a[42]), "+f"(a[43]), \
  "+f"(a[44]), "+f"(a[45]), "+f"(a[46]), "+f"(a[47]), "+f"(a[48]), "+f"(a[49]), \
  "+f"(a[50]), "+f"(a[51]), "+f"(a[52]), "+f"(a[53]), "+f"(a[54]), "+f"(a[55]), \
  "+f"(a[56]), "+f"(a[57]), "+f"(a[58]), "+f"(a[59]), "+f"(a[60]), "+f"(a[61]), \
  "+f"(a[62]), "+f"(a[63])
#define FLASHSTEP_ACC64_PLACES \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/// The same as wgmma_m64n64k16_ss, 128 columns wide: acc (m64 x n128 fp32,
/// accumulator_coord with registers 0..63) += kScaleA A (m64 x k16) *
/// B (k16 x n128). A K-major B descriptor names 16 atoms of 8 n rows, SBO
/// apart: 128 rows of Kj for S = Qi Kj^T, one instruction wide.
template <typename Elem, int kScaleA, int kTransposeB>
__device__ inline void wgmma_m64n128k16_ss(float (&acc)[64], std::uint64_t desc_a,
                                           std::uint64_t desc_b, int accumulate) {
  static_assert(kScaleA == 1 || kScaleA == -1, "imm-scale-a is 1 or -1");
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FLASHSTEP_ACC64_PLACES
        ", %64, %65, p, %67, 1, 0, %68;\n}\n"
        : FLASHSTEP_ACC64(acc)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kScaleA), "n"(kTransposeB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FLASHSTEP_ACC64_PLACES
        ", %64, %65, p, %67, 1, 0, %68;\n}\n"
        : FLASHSTEP_ACC64(acc)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kScaleA), "n"(kTransposeB));
  }
}

/// A and B in shared memory, kN (64 or 128) columns wide: the one above of
/// that width, for a caller whose tile width is a template parameter.
template <typename Elem, int kN, int kScaleA, int kTransposeB>
__device__ inline void wgmma_m64nNk16_ss(float (&acc)[kN / 2], std::uint64_t desc_a,
                                         std::uint64_t desc_b, int accumulate) {
  static_assert(kN == 64 || kN == 128, "wrapped widths: n64 and n128");
  if constexpr (kN == 64) {
    wgmma_m64n64k16_ss<Elem, kScaleA, kTransposeB>(acc, desc_a, desc_b, accumulate);
  } else {
    wgmma_m64n128k16_ss<Elem, kScaleA, kTransposeB>(acc, desc_a, desc_b, accumulate);
  }
}

/// The same as wgmma_m64n64k16_rs, 128 columns wide: acc (m64 x n128 fp32)
/// += A (m64 x k16, in registers) * B (k16 x n128). An MN-major B descriptor
/// names two 64-column blocks, LBO apart: 128 columns of Vj for O~ += P~ Vj
/// (d = 128), P~'s registers passed once for all of them.
template <typename Elem, int kTransposeB>
__device__ inline void wgmma_m64n128k16_rs(float (&acc)[64], const std::uint32_t (&a)[4],
                                           std::uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FLASHSTEP_ACC64_PLACES
        ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : FLASHSTEP_ACC64(acc)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate),
          "n"(kTransposeB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FLASHSTEP_ACC64_PLACES
        ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : FLASHSTEP_ACC64(acc)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate),
          "n"(kTransposeB));
  }
}

/// A in registers, kN (64 or 128) columns wide.
template <typename Elem, int kN, int kTransposeB>
__device__ inline void wgmma_m64nNk16_rs(float (&acc)[kN / 2], const std::uint32_t (&a)[4],
                                         std::uint64_t desc_b, int accumulate) {
  static_assert(kN == 64 || kN == 128, "wrapped widths: n64 and n128");
  if constexpr (kN == 64) {
    wgmma_m64n64k16_rs<Elem, kTransposeB>(acc, a, desc_b, accumulate);
  } else {
    wgmma_m64n128k16_rs<Elem, kTransposeB>(acc, a, desc_b, accumulate);
  }
}

#undef FLASHSTEP_ACC32
#undef FLASHSTEP_ACC32_PLACES
#undef FLASHSTEP_ACC64
#undef FLASHSTEP_ACC64_PLACES

/// Two fp32 values rounded to Elem and packed into one 32-bit register, the
/// lower column in the low half (the A operand's element order).
template <typename Elem>
__device__ inline std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

// ---------------------------------------------------------------------------
// Proxies: the tensor cores and the copy engine read shared memory through
// the "async proxy"; ordinary loads and stores go through the generic one.

/// `fence.proxy.async.shared::cta`, section "membar / fence": makes this
/// thread's earlier generic-proxy writes to shared memory (ordinary stores,
/// mbarrier.init) visible to later async-proxy accesses (wgmma operands read
/// through descriptors, cp.async.bulk). Each writing thread fences, then a
/// barrier orders the readers after it.
__device__ inline void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---------------------------------------------------------------------------
// mbarrier: a 64-bit shared-memory object counting arrivals and expected
// transaction bytes. A phase completes when `count` threads have arrived and
// every expected byte has landed; then the phase bit flips and a new phase
// starts. Waiters name the parity of the phase they wait for.

/// `mbarrier.init.shared::cta.b64`, section "mbarrier.init": sets the barrier
/// at `bar` to expect `count` arrivals per phase, in phase 0. One thread
/// initializes; fence_proxy_async_shared and a block barrier publish it.
__device__ inline void mbarrier_init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64`, section
/// "mbarrier.expect_tx" / "mbarrier.arrive": this thread's arrival, plus
/// `bytes` more transaction bytes the current phase must see land (the bulk
/// copies issued next complete them with complete_tx).
__device__ inline void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

/// `mbarrier.arrive.shared::cta.b64`, section "mbarrier.arrive": one arrival
/// (a consumer saying it is done with a buffer).
__device__ inline void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

/// `mbarrier.try_wait.parity.shared::cta.b64` in a loop, section
/// "mbarrier.test_wait / mbarrier.try_wait": returns once the phase with
/// parity `phase` (0 or 1) has completed. try_wait suspends the thread for a
/// while in hardware before it reports "not yet", so the loop is not a busy spin.
__device__ inline void mbarrier_wait(std::uint64_t* bar, std::uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(phase)
      : "memory");
}

// ---------------------------------------------------------------------------
// TMA: the tensor memory accelerator copies a box of a tensor, described by
// a CUtensorMap the host encodes (cuTensorMapEncodeTiled), into shared memory
// and back.

/// cp.async.bulk.tensor.3d.shared\::cluster.global.mbarrier\::complete_tx\::bytes,
/// section "cp.async.bulk.tensor": copies the box whose first element is at
/// coordinates (c0, c1, c2) of the tensor `map` describes (c0 the innermost,
/// contiguous dimension) into shared memory at `dst`, swizzled as the map
/// says; elements outside the tensor arrive as zeros. When the bytes have
/// landed it performs complete_tx on `bar` for the whole box. `map` is the
/// address of a __grid_constant__ kernel parameter. Issued by one thread.
__device__ inline void tma_load_3d(void* dst, const void* map, std::uint64_t* bar, int c0,
                                   int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

/// cp.async.bulk.tensor.3d.global.shared\::cta.tile.bulk_group, section
/// "cp.async.bulk.tensor": the store direction of tma_load_3d. Copies the
/// box of shared memory at `src` (laid out and swizzled as the map says) to
/// the box of the tensor `map` describes whose first element is at
/// coordinates (c0, c1, c2); elements of the box outside the tensor are not
/// written. Completes through a bulk async-group of the issuing thread
/// (bulk_commit_group, bulk_wait_group_read), not an mbarrier: the threads
/// that wrote `src` fence (fence_proxy_async_shared) and meet at a barrier
/// before one of them issues it. Issued by one thread.
__device__ inline void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group"
      " [%0, {%2, %3, %4}], [%1];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)),
      "r"(smem_address(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

/// cp.async.bulk.commit_group, section "cp.async.bulk.commit_group": closes
/// this thread's bulk copies issued since the last commit (tma_store_3d)
/// into one bulk async-group.
__device__ inline void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/// cp.async.bulk.wait_group.read N, section "cp.async.bulk.wait_group": waits
/// until at most N of this thread's bulk async-groups are still reading
/// their shared-memory source; their writes to global memory may still be
/// on the way. N = 0: the source buffer may be written again.
template <int N>
__device__ inline void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/// cp.async.bulk.wait_group N (without .read): waits until at most N of
/// this thread's bulk async-groups are pending, their writes done too.
template <int N>
__device__ inline void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------
// Named barriers: 16 per block (0 is __syncthreads'), each counting arriving
// threads; a subset of the block can synchronize on one without the rest.

/// bar.sync id, count, section "bar, barrier": this thread arrives at
/// barrier `id` and waits until `count` threads (a multiple of 32, counting
/// this one) have arrived, by bar.sync or bar.arrive.
__device__ inline void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// bar.arrive id, count: arrives at barrier `id` without waiting (the other
/// party of a producer-consumer hand-over: it lets bar.sync on `id` go on).
__device__ inline void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---------------------------------------------------------------------------
// Row reductions of an accumulator.

/// The max (kMax) or the sum, over this thread's registers of an m64 x nN
/// fp32 accumulator (accumulator_coord's layout, kRegs = N / 2), of its row
/// h (0: row g, 1: row g + 8; two registers of each n8 tile): the n8 tiles'
/// pairs dealt round-robin to kWays partials (each a chain), then a tree of
/// the partials. One chain (acc = op(acc, x) register by register) is
/// N / 4 - 1 dependent FMNMX or FADD, each waiting ~4 cycles for the one
/// before; kWays = N / 8 (the default) is a tree of depth log2(N / 8) + 1,
/// fewer ways hold fewer partials live where registers are short. The
/// caller finishes the row across the quad (shuffles by 1 and 2).
template <bool kMax, int kWays = 0, int kRegs>
__device__ inline float row_reduce(const float (&acc)[kRegs], int h) {
  auto op = [](float a, float b) { return kMax ? fmaxf(a, b) : a + b; };
  constexpr int kLeaves = kRegs / 4;  // n8 tiles: two of the row's registers each
  constexpr int kParts = kWays == 0 ? kLeaves : kWays;
  static_assert(kParts > 0 && (kParts & (kParts - 1)) == 0 && kLeaves % kParts == 0,
                "a power of two of partials, each as many n8 tiles");
  float v[kParts];
#pragma unroll
  for (int nt = 0; nt < kLeaves; ++nt) {
    const float pair = op(acc[4 * nt + 2 * h], acc[4 * nt + 2 * h + 1]);
    v[nt % kParts] = nt < kParts ? pair : op(v[nt % kParts], pair);
  }
#pragma unroll
  for (int width = kParts / 2; width > 0; width /= 2) {
#pragma unroll
    for (int i = 0; i < width; ++i) v[i] = op(v[i], v[i + width]);
  }
  return v[0];
}

// ---------------------------------------------------------------------------
// Registers between warpgroups.

/// setmaxnreg.inc.sync.aligned.u32 N, section "setmaxnreg": raises this
/// warpgroup's per-thread register limit to N (a multiple of 8, 24..256),
/// taking registers that other warpgroups released. The kernel must start
/// with a register cap (__launch_bounds__(threads, 1)).
template <int N>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// setmaxnreg.dec.sync.aligned.u32 N: lowers it to N, releasing the rest
/// (a producer warpgroup that only issues copies needs few).
template <int N>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace flashstep::sm90
