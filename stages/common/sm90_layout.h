/// \file sm90_layout.h
/// \brief Hopper's (sm_90a) operand layouts as plain index arithmetic, shared
/// by the kernels (common/wgmma_sm90.cuh, stage 08) and the CPU tests that
/// check them against the PTX ISA's figures: which thread of a warpgroup holds
/// which element of a wgmma accumulator or register A operand, where the
/// 128-byte swizzle puts an element of a tile in shared memory, and what the
/// 64-bit shared-memory matrix descriptor encodes. CUDA-free.
///
/// Section names are those of NVIDIA's "Parallel Thread Execution ISA"
/// (PTX ISA 9.0): "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
/// Operation using wgmma.mma_async instructions" and its subsections
/// "Register Fragments" and "Shared Memory Matrix Layout"; the swizzle is the
/// one "Tensor Copy" (cp.async.bulk.tensor) writes with CU_TENSOR_MAP_SWIZZLE_128B.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace flashstep::sm90 {

/// Dynamic shared memory one block may opt in to on sm_90 (227 KiB of an
/// SM's 228): the kernels' shared-memory budgets are checked against it at
/// compile time (stage 07's backward, stage 08).
inline constexpr int kMaxSmemBytesPerBlock = 227 * 1024;

/// Threads of a warpgroup: 4 consecutive warps, the first at a warp index
/// divisible by 4. A wgmma is issued by all 128 together.
inline constexpr int kWarpgroupThreads = 128;
/// Rows of every wgmma's A and D: m64.
inline constexpr int kWgmmaM = 64;
/// Its k depth for 16-bit inputs: k16.
inline constexpr int kWgmmaK = 16;
/// Bytes of one swizzled row: the 128-byte swizzle permutes the eight
/// 16-byte chunks of each 128-byte row, so a tile is stored as column blocks
/// of 64 16-bit elements.
inline constexpr int kSwizzleRowBytes = 128;
/// 16-bit elements in one such row: the width of one column block.
inline constexpr int kSwizzleRowElems = 64;
/// Rows after which the swizzle pattern repeats: 8 rows of 128 bytes, one
/// 1024-byte "swizzle atom". Tiles start on a 1024-byte boundary so that the
/// pattern, which the hardware computes from address bits, starts at row 0.
inline constexpr int kSwizzleAtomRows = 8;
inline constexpr int kSwizzleAtomBytes = kSwizzleAtomRows * kSwizzleRowBytes;

/// A (row, column) position in a matrix.
struct Coord {
  int row;
  int col;
};

/// Element `e` (0 or 1, low half first) of 32-bit register `reg` of thread
/// `thread` (0..127 in the warpgroup) of an m64nNk16 fp32 accumulator D,
/// figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D":
/// warp w = thread / 32 owns rows 16w .. 16w + 15; inside it, with lane =
/// thread % 32, g = lane / 4, t = lane % 4, registers 4i .. 4i + 3 cover
/// columns 8i .. 8i + 7 exactly as one mma.m16n8 C fragment does:
///
///   reg 4i + 0, 4i + 1: (16w + g,     8i + 2t, 8i + 2t + 1)
///   reg 4i + 2, 4i + 3: (16w + g + 8, 8i + 2t, 8i + 2t + 1)
///
/// For fp32 accumulators each register holds one element, so e is 0 there;
/// accumulator_coord(thread, reg) takes the register index alone.
FLASHSTEP_HOST_DEVICE constexpr Coord accumulator_coord(int thread, int reg) {
  const int warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, t = lane % 4;
  const int i = reg / 4, r = reg % 4;
  return {16 * warp + g + 8 * (r / 2), 8 * i + 2 * t + r % 2};
}

/// Element `e` (0: low half, 1: high half) of 32-bit register `reg` (0..3)
/// of thread `thread` of the 16-bit A operand in registers, m64 x k16,
/// figure "WGMMA .m64nNk16 register fragment layout for matrix A": warp w
/// owns rows 16w .. 16w + 15, laid out as one mma.m16n8k16 A fragment:
///
///   a0: (16w + g,     2t + e)    a2: (16w + g,     8 + 2t + e)
///   a1: (16w + g + 8, 2t + e)    a3: (16w + g + 8, 8 + 2t + e)
FLASHSTEP_HOST_DEVICE constexpr Coord a_register_coord(int thread, int reg, int e) {
  const int warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, t = lane % 4;
  return {16 * warp + g + 8 * (reg % 2), 8 * (reg / 2) + 2 * t + e};
}

/// Which accumulator register of an S = Q K^T product (m64 x n, fp32) holds
/// element `e` of A register `reg` of k16 block `kk` of P = f(S), for the same
/// thread: the register trick FlashAttention-2 uses with mma.sync works with
/// wgmma too, because accumulator columns 16kk .. 16kk + 15 of a thread are
/// its A columns 0..15 of block kk. Returns the accumulator register index.
FLASHSTEP_HOST_DEVICE constexpr int p_source_register(int kk, int reg, int e) {
  // a0 <- n8 tile 2kk rows g (regs 0, 1); a1 <- tile 2kk row g + 8 (regs 2, 3);
  // a2 <- tile 2kk + 1 row g; a3 <- tile 2kk + 1 row g + 8.
  return 4 * (2 * kk + reg / 2) + 2 * (reg % 2) + e;
}

/// Byte offset of 16-bit element (row, col) in a tile stored as the 128-byte
/// swizzle stores it: column blocks of 64 elements, each [rows][128 bytes],
/// one after the other (`rows` rows each); inside a block, 16-byte chunk c of
/// row r sits at chunk position c ^ (r % 8) (CUTLASS's Swizzle<3, 4, 3> on
/// byte addresses), figure "128B swizzle" of "Tensor Copy":
///
///   chunk position:  0   1   2   3   4   5   6   7
///   row 0 holds      c0  c1  c2  c3  c4  c5  c6  c7
///   row 1 holds      c1  c0  c3  c2  c5  c4  c7  c6
///   row 2 holds      c2  c3  c0  c1  c6  c7  c4  c5
///   ...
///   row 7 holds      c7  c6  c5  c4  c3  c2  c1  c0
///
/// This is what cp.async.bulk.tensor writes for a box 64 elements wide with
/// CU_TENSOR_MAP_SWIZZLE_128B, and what a wgmma descriptor with swizzle mode
/// 128B reads; stage 08 writes the same layout by hand when it loads tiles
/// without TMA.
FLASHSTEP_HOST_DEVICE constexpr int swizzle128_offset(int row, int col, int rows) {
  const int block = col / kSwizzleRowElems;
  const int byte_in_row = col % kSwizzleRowElems * 2;
  const int chunk = byte_in_row / 16;
  return block * rows * kSwizzleRowBytes + row * kSwizzleRowBytes +
         (chunk ^ (row % kSwizzleAtomRows)) * 16 + byte_in_row % 16;
}

/// The swizzle modes of a matrix descriptor, bits 62-63.
enum class Swizzle : int { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

/// A shared-memory matrix descriptor, section "Matrix Descriptor Format":
///   bits  0-13  start address >> 4 (of the 18-bit shared-memory address)
///   bits 16-29  leading dimension byte offset >> 4 (LBO)
///   bits 32-45  stride dimension byte offset >> 4 (SBO)
///   bits 49-51  matrix base offset (0: the tile starts on a swizzle atom)
///   bits 62-63  swizzle mode
/// For the 128-byte swizzle:
/// - K-major (k contiguous, the layout of Q and K: S = Q K^T reduces over d):
///   8-row groups (atoms) are SBO = 1024 bytes apart along M/N; one k16 step
///   is 32 bytes inside a 128-byte row, so LBO (the stride between atoms
///   along k) is never used by one instruction and is set to 1 by convention.
///   The k-th k16 step of a column block starts 32 k bytes further on.
/// - MN-major (n contiguous, V in O += P V, read with the transpose bit):
///   8 consecutive k rows of 128 bytes (64 n) form an atom; SBO = 1024 bytes
///   to the next 8 k rows, LBO to the next 64 n (the next column block).
FLASHSTEP_HOST_DEVICE constexpr std::uint64_t make_descriptor(std::uint32_t smem_address,
                                                              std::uint32_t lbo_bytes,
                                                              std::uint32_t sbo_bytes,
                                                              Swizzle swizzle) {
  constexpr std::uint64_t k14 = 0x3FFF;
  return (static_cast<std::uint64_t>((smem_address & 0x3FFFF) >> 4) & k14) |
         (static_cast<std::uint64_t>(lbo_bytes >> 4) & k14) << 16 |
         (static_cast<std::uint64_t>(sbo_bytes >> 4) & k14) << 32 |
         static_cast<std::uint64_t>(static_cast<int>(swizzle)) << 62;
}

/// The descriptor of the same operand `bytes` (a multiple of 16) further on
/// in shared memory: make_descriptor(a + bytes, ...) as long as a + bytes
/// stays below the 256 KiB the 18-bit address spans, where the start field
/// (bits 0-13) cannot carry into LBO. Only the low 32 bits change, by a
/// constant, so a wgmma chain builds its descriptor once and adds one
/// integer per instruction, instead of masking and shifting each address
/// (CUTLASS's descriptor iterator does the same).
FLASHSTEP_HOST_DEVICE constexpr std::uint64_t advance_descriptor(std::uint64_t desc,
                                                                 std::uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<std::uint32_t>(desc + (bytes >> 4));
}

/// The fields of a descriptor, back in bytes: for the tests, and to read one.
struct DescriptorFields {
  std::uint32_t start;  ///< start address, bytes
  std::uint32_t lbo;    ///< leading dimension byte offset
  std::uint32_t sbo;    ///< stride dimension byte offset
  Swizzle swizzle;
};
FLASHSTEP_HOST_DEVICE constexpr DescriptorFields decode_descriptor(std::uint64_t desc) {
  return {static_cast<std::uint32_t>(desc & 0x3FFF) << 4,
          static_cast<std::uint32_t>(desc >> 16 & 0x3FFF) << 4,
          static_cast<std::uint32_t>(desc >> 32 & 0x3FFF) << 4,
          static_cast<Swizzle>(desc >> 62 & 3)};
}

/// The byte address a 128B-swizzled, K-major descriptor names for element
/// (mn, k) of its operand (mn < 64 for A, < N for B; k < 16), as section
/// "Shared Memory Matrix Layout" defines the canonical layout
/// Swizzle<3,4,3> o ((8, m), (8 elements, k)) : ((128 B, SBO), (2 B, ...)):
/// row mn % 8 of atom mn / 8 at start + (mn / 8) SBO + (mn % 8) 128, element
/// k at byte 2k of it, then the swizzle applied to the address bits (the
/// 16-byte chunk index, bits 4-6, XOR the row in the atom, bits 7-9).
FLASHSTEP_HOST_DEVICE constexpr std::uint32_t k_major_address(std::uint64_t desc, int mn, int k) {
  const DescriptorFields f = decode_descriptor(desc);
  const std::uint32_t linear = f.start + static_cast<std::uint32_t>(mn / 8) * f.sbo +
                               static_cast<std::uint32_t>(mn % 8) * kSwizzleRowBytes +
                               static_cast<std::uint32_t>(k) * 2;
  return linear ^ ((linear >> 7 & 7) << 4);
}

/// The same for a 128B-swizzled MN-major descriptor (the transposed B
/// operand): element (k, n) of B (k < 16, n < N) sits in k row k % 8 of the
/// atom k / 8 (SBO apart), column block n / 64 (LBO apart), byte 2 (n % 64)
/// of the 128-byte row, swizzled as above.
FLASHSTEP_HOST_DEVICE constexpr std::uint32_t mn_major_address(std::uint64_t desc, int k, int n) {
  const DescriptorFields f = decode_descriptor(desc);
  const std::uint32_t linear = f.start + static_cast<std::uint32_t>(n / 64) * f.lbo +
                               static_cast<std::uint32_t>(k / 8) * f.sbo +
                               static_cast<std::uint32_t>(k % 8) * kSwizzleRowBytes +
                               static_cast<std::uint32_t>(n % 64) * 2;
  return linear ^ ((linear >> 7 & 7) << 4);
}

}  // namespace flashstep::sm90
