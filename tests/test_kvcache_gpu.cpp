// Stage 09's KV cache on the GPU (a test case of test_gpu, built when stage
// 09 is): forward_kvcache with sequence lengths that differ across the batch,
// in fp32 and in the 16-bit types, against each sequence's own fp64 problem,
// outputs poisoned first; contiguous, and paged with new tokens appended.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "09_split_kv/split_kv.h"
#include "common/check.h"
#include "common/device.h"
#include "common/rounding.h"
#include "common/stage.h"
#include "kvcache_fixture.h"
#include "shapes.h"

using flashstep::DType;
using flashstep::Problem;

bool gpu_test_selects(std::string_view name);  // test_gpu.cpp

namespace {

// A device buffer of `count` T, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T) + 1) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

// fp32 runs on the CUDA-core split kernel, fp16 and bf16 on the tensor-core
// one (split_kv.cu), so both types run, at every head-dimension bucket and a
// ragged d (59, 40: the element-by-element copies); G = H / H_kv from 1 to 32
// (MQA), Nq from 1 to 16 (up to 512 rows of a group: several row tiles).
TEST_CASE("stage 09's KV cache: per-sequence lengths (0, 1, capacity, ragged), split and one block") {
  if (!gpu_test_selects("09_split_kv")) return;
  const std::vector<std::int32_t> seqlens = {1, 700, 0, 17, 699, 256, 333};
  const std::vector<std::int64_t> keys(seqlens.begin(), seqlens.end());
  struct TypedD {
    DType t;
    std::int64_t d;
  };
  const TypedD cases[] = {{DType::kFp32, 128}, {DType::kBf16, 128}, {DType::kBf16, 59},
                          {DType::kFp16, 256}, {DType::kFp16, 40}};
  struct Heads {
    std::int64_t H, H_kv;
  };
  const Heads heads[] = {{8, 1}, {8, 2}, {8, 8}, {32, 1}};
  std::uint64_t seed = 7000;
  for (const TypedD& td : cases) {
    for (std::int64_t Nq : {1, 3, 16}) {
      for (const Heads& hk : heads) {
        for (bool causal : {false, true}) {
          for (bool split : {true, false}) {
            Problem p = flashstep::test::make_problem(static_cast<std::int64_t>(seqlens.size()), hk.H,
                                                      Nq, 700, td.d, causal);
            p.H_kv = hk.H_kv;
            p.dtype = td.t;
            CAPTURE(p.describe());
            CAPTURE(split);
            const std::int64_t E = p.elem_bytes();
            const auto in = flashstep::random_inputs(p, seed++);
            DeviceBuffer<char> Q(in.Q.size() * E), K(in.K.size() * E), V(in.V.size() * E),
                O(in.Q.size() * E);
            DeviceBuffer<float> L(static_cast<size_t>(p.lse_elems()));
            DeviceBuffer<std::int32_t> lens(seqlens.size());
            const std::int64_t ws = flashstep::split_kv::workspace_bytes(p);
            DeviceBuffer<char> work(static_cast<size_t>(ws));
            flashstep::copy_to_device(Q.ptr, in.Q.data(), p.q_elems(), p.dtype, "copy Q");
            flashstep::copy_to_device(K.ptr, in.K.data(), p.kv_elems(), p.dtype, "copy K");
            flashstep::copy_to_device(V.ptr, in.V.data(), p.kv_elems(), p.dtype, "copy V");
            REQUIRE(cudaMemcpy(lens.ptr, seqlens.data(), seqlens.size() * 4, cudaMemcpyHostToDevice) ==
                    cudaSuccess);
            REQUIRE(cudaMemset(O.ptr, 0xFF, in.Q.size() * E) == cudaSuccess);  // NaN: every element must be written
            REQUIRE(cudaMemset(L.ptr, 0xFF, static_cast<size_t>(p.lse_elems()) * 4) == cudaSuccess);
            flashstep::ForwardTensors t;
            t.Q = Q.ptr;
            t.K = K.ptr;
            t.V = V.ptr;
            t.O = O.ptr;
            t.L = L.ptr;
            t.workspace = work.ptr;
            flashstep::split_kv::forward_kvcache(p, t, lens.ptr, nullptr, split);
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
            std::vector<float> got_O, got_L;
            flashstep::copy_to_host(got_O, O.ptr, p.q_elems(), p.dtype, "copy O");
            flashstep::copy_to_host(got_L, L.ptr, p.lse_elems(), DType::kFp32, "copy L");
            // Sequence b against the problem of its own length on its cached keys.
            flashstep::test::check_sequences(p, in.Q, in.K, in.V, keys, got_O.data(), got_L.data());
          }
        }
      }
    }
  }
}

// The paged cache and the append on the GPU: pages in a shuffled order with
// NaN pages no table names (a stray read shows), both split kernels (fp32
// and the 16-bit one, each compiled for the paged layout), every bucket and
// a ragged d, page sizes of one and four granules; each sequence against the
// fp64 reference on its cached keys then its new ones, and the pool read
// back afterwards: the new tokens where the block table puts them.
TEST_CASE("stage 09's KV cache, paged and appended to (shuffled pages, NaN spares), split and one block") {
  if (!gpu_test_selects("09_split_kv")) return;
  const std::vector<std::int64_t> before = {0, 1, 700, 17, 751, 256, 333};
  const std::vector<std::int32_t> before32(before.begin(), before.end());
  const std::int64_t capacity = 768;
  struct TypedD {
    DType t;
    std::int64_t d;
  };
  const TypedD cases[] = {{DType::kFp32, 128}, {DType::kFp32, 64}, {DType::kBf16, 128},
                          {DType::kBf16, 64}, {DType::kFp16, 256}, {DType::kBf16, 59}};
  struct Heads {
    std::int64_t H, H_kv;
  };
  const Heads heads[] = {{8, 1}, {8, 8}, {32, 4}};
  std::uint64_t seed = 9000;
  for (const TypedD& td : cases) {
    for (std::int64_t page_keys : {64, 256}) {
      for (std::int64_t Nq : {1, 16}) {
        for (const Heads& hk : heads) {
          for (bool causal : {false, true}) {
            for (bool append : {false, true}) {
              Problem p = flashstep::test::make_problem(static_cast<std::int64_t>(before.size()),
                                                        hk.H, Nq, capacity, td.d, causal);
              p.H_kv = hk.H_kv;
              p.dtype = td.t;
              const bool split = (seed % 2) == 0;  // both, across the cases
              CAPTURE(p.describe());
              CAPTURE(page_keys);
              CAPTURE(append);
              CAPTURE(split);
              const std::int64_t E = p.elem_bytes();
              auto in = flashstep::random_inputs(p, seed++);
              Problem fresh = p;  // the new tokens: [B, H_kv, Nq, d]
              fresh.Nk = Nq;
              const auto added = flashstep::random_inputs(fresh, seed++);
              const auto paged = flashstep::test::page_cache(p, in.K, in.V, page_keys, seed++);
              const auto pool = static_cast<std::int64_t>(paged.K.size());
              DeviceBuffer<char> Q(in.Q.size() * E), K(paged.K.size() * E), V(paged.V.size() * E),
                  O(in.Q.size() * E), K_new(added.K.size() * E), V_new(added.V.size() * E);
              DeviceBuffer<float> L(static_cast<size_t>(p.lse_elems()));
              DeviceBuffer<std::int32_t> lens(before.size()), table(paged.table.size());
              DeviceBuffer<char> work(static_cast<size_t>(flashstep::split_kv::workspace_bytes(p)));
              flashstep::copy_to_device(Q.ptr, in.Q.data(), p.q_elems(), p.dtype, "copy Q");
              flashstep::copy_to_device(K.ptr, paged.K.data(), pool, p.dtype, "copy K");
              flashstep::copy_to_device(V.ptr, paged.V.data(), pool, p.dtype, "copy V");
              flashstep::copy_to_device(K_new.ptr, added.K.data(), fresh.kv_elems(), p.dtype, "copy K_new");
              flashstep::copy_to_device(V_new.ptr, added.V.data(), fresh.kv_elems(), p.dtype, "copy V_new");
              REQUIRE(cudaMemcpy(lens.ptr, before32.data(), before32.size() * 4, cudaMemcpyHostToDevice) ==
                      cudaSuccess);
              REQUIRE(cudaMemcpy(table.ptr, paged.table.data(), paged.table.size() * 4,
                                 cudaMemcpyHostToDevice) == cudaSuccess);
              REQUIRE(cudaMemset(O.ptr, 0xFF, in.Q.size() * E) == cudaSuccess);  // NaN: every element must be written
              REQUIRE(cudaMemset(L.ptr, 0xFF, static_cast<size_t>(p.lse_elems()) * 4) == cudaSuccess);
              flashstep::ForwardTensors t;
              t.Q = Q.ptr;
              t.O = O.ptr;
              t.L = L.ptr;
              t.workspace = work.ptr;
              flashstep::split_kv::KvCache cache;
              cache.K = K.ptr;
              cache.V = V.ptr;
              cache.seqlens = lens.ptr;
              cache.layout = {table.ptr, paged.pages_per_seq, page_keys};
              cache.K_new = append ? K_new.ptr : nullptr;
              cache.V_new = append ? V_new.ptr : nullptr;
              flashstep::split_kv::forward_kvcache(p, t, cache, nullptr, split);
              REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
              std::vector<float> got_O, got_L, got_K;
              flashstep::copy_to_host(got_O, O.ptr, p.q_elems(), p.dtype, "copy O");
              flashstep::copy_to_host(got_L, L.ptr, p.lse_elems(), DType::kFp32, "copy L");
              std::vector<std::int64_t> keys = before;
              if (append) {
                flashstep::test::append_contiguous(p, in.K, in.V, added.K, added.V, before);
                for (std::int64_t& n : keys) n += Nq;
              }
              flashstep::test::check_sequences(p, in.Q, in.K, in.V, keys, got_O.data(), got_L.data());
              if (append) {  // the pool holds the new tokens (rounded to p.dtype) where the table says
                flashstep::copy_to_host(got_K, K.ptr, pool, p.dtype, "copy K back");
                std::int64_t wrong = 0;
                for (std::int64_t b = 0; b < p.B; ++b) {
                  for (std::int64_t h = 0; h < p.kv_heads(); ++h) {
                    for (std::int64_t i = 0; i < Nq; ++i) {
                      const float* got = flashstep::test::paged_key(p, paged, got_K, b, h, before[b] + i);
                      const float* want = added.K.data() + ((b * p.kv_heads() + h) * Nq + i) * p.d;
                      for (std::int64_t c = 0; c < p.d; ++c) {
                        wrong += got[c] != flashstep::round_to_dtype(p.dtype, want[c]);
                      }
                    }
                  }
                }
                CHECK(wrong == 0);
              }
            }
          }
        }
      }
    }
  }
}

// The split rule counts waves with resident_blocks (split_kv_plan.h), the
// blocks an SM of sm_90 holds; the device's occupancy must agree, or a change
// of registers or shared memory has moved it and the table is stale.
TEST_CASE("stage 09: the split rule's resident blocks are the device's occupancy (sm_90)") {
  if (!gpu_test_selects("09_split_kv")) return;
  int device = 0, major = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess);
  if (major != 9) {
    MESSAGE("resident_blocks is for sm_90; this device is sm_" << major << "x: not checked");
    return;
  }
  for (DType t : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    for (std::int64_t d : {64, 128, 256}) {
      Problem p = flashstep::test::make_problem(1, 8, 1, 1024, d, false);
      p.dtype = t;
      CAPTURE(p.describe());
      CHECK(flashstep::split_kv::device_resident_blocks(p) ==
            flashstep::split_kv::resident_blocks(t, static_cast<int>(d)));
    }
  }
  // A wide group (MQA, Nq = 4: 128 rows at d = 128) runs the Hopper kernel.
  for (DType t : {DType::kBf16, DType::kFp16}) {
    Problem p = flashstep::test::make_problem(1, 32, 4, 1024, 128, false);
    p.H_kv = 1;
    p.dtype = t;
    CAPTURE(p.describe());
    CHECK(flashstep::split_kv::device_resident_blocks(p) == flashstep::split_kv::kWideResidentBlocks);
  }
}
