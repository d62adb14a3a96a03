// Stage 09's KV cache on the GPU (a test case of test_gpu, built when stage
// 09 is): forward_kvcache with sequence lengths that differ across the batch,
// against each sequence's own fp64 problem, outputs poisoned first.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "09_split_kv/split_kv.h"
#include "common/check.h"
#include "common/stage.h"
#include "shapes.h"

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

TEST_CASE("stage 09's KV cache: per-sequence lengths (0, 1, capacity, ragged), split and one block") {
  if (!gpu_test_selects("09_split_kv")) return;
  const std::vector<std::int32_t> seqlens = {1, 700, 0, 17, 699, 256, 333};
  std::uint64_t seed = 7000;
  for (std::int64_t Nq : {1, 3, 16}) {
    for (std::int64_t H_kv : {1, 2, 8}) {
      for (bool causal : {false, true}) {
        for (bool split : {true, false}) {
          Problem p = flashstep::test::make_problem(static_cast<std::int64_t>(seqlens.size()), 8, Nq,
                                                    700, 128, causal);
          p.H_kv = H_kv;
          CAPTURE(p.describe());
          CAPTURE(split);
          const auto in = flashstep::random_inputs(p, seed++);
          DeviceBuffer<float> Q(in.Q.size()), K(in.K.size()), V(in.V.size()), O(in.Q.size()),
              L(static_cast<size_t>(p.lse_elems()));
          DeviceBuffer<std::int32_t> lens(seqlens.size());
          const std::int64_t ws = flashstep::split_kv::workspace_bytes(p);
          DeviceBuffer<char> work(static_cast<size_t>(ws));
          REQUIRE(cudaMemcpy(Q.ptr, in.Q.data(), in.Q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
          REQUIRE(cudaMemcpy(K.ptr, in.K.data(), in.K.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
          REQUIRE(cudaMemcpy(V.ptr, in.V.data(), in.V.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
          REQUIRE(cudaMemcpy(lens.ptr, seqlens.data(), seqlens.size() * 4, cudaMemcpyHostToDevice) ==
                  cudaSuccess);
          REQUIRE(cudaMemset(O.ptr, 0xFF, in.Q.size() * 4) == cudaSuccess);  // NaN: every element must be written
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
          std::vector<float> got_O(in.Q.size()), got_L(static_cast<size_t>(p.lse_elems()));
          REQUIRE(cudaMemcpy(got_O.data(), O.ptr, got_O.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
          REQUIRE(cudaMemcpy(got_L.data(), L.ptr, got_L.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
          // Sequence b against the problem of its own length on its cached keys.
          const std::int64_t q_seq = p.H * Nq * p.d, rows_seq = p.H * Nq;
          for (std::int64_t b = 0; b < p.B; ++b) {
            CAPTURE(b);
            const std::int64_t n = seqlens[static_cast<size_t>(b)];
            if (n == 0) {
              for (std::int64_t e = 0; e < q_seq; ++e) REQUIRE(got_O[b * q_seq + e] == 0.0f);
              for (std::int64_t e = 0; e < rows_seq; ++e) REQUIRE(got_L[b * rows_seq + e] == -INFINITY);
              continue;
            }
            Problem one = p;
            one.B = 1;
            one.Nk = n;
            flashstep::Inputs seq;
            seq.Q.assign(in.Q.begin() + b * q_seq, in.Q.begin() + (b + 1) * q_seq);
            for (std::int64_t h = 0; h < H_kv; ++h) {
              const std::int64_t at = (b * H_kv + h) * p.Nk * p.d;
              seq.K.insert(seq.K.end(), in.K.begin() + at, in.K.begin() + at + n * p.d);
              seq.V.insert(seq.V.end(), in.V.begin() + at, in.V.begin() + at + n * p.d);
            }
            const auto c = flashstep::check_forward(one, got_O.data() + b * q_seq,
                                                    got_L.data() + b * rows_seq,
                                                    flashstep::forward_truth(one, seq));
            CHECK_MESSAGE(c.ok(), c.summary());
          }
        }
      }
    }
  }
}
