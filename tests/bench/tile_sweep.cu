// flashstep_tile_sweep: stage 07's kernel (all ablation steps on) at other
// tile shapes than the ones it ships with, checked and timed, so that the
// choice in tensor_core_tiles.h (tile_shape) is a measured one.
//
// A tile shape is (Br, Bc, warps): rows of Q per thread block, keys per K/V
// tile, warps per block (each warp owns Br / warps rows). It decides how many
// accumulator registers a thread holds (Br / warps x (Bc + d) fp32 values
// spread over its warp), how much shared memory a block takes ((Br + 2 Bc) d
// 16-bit elements), so how many blocks share an SM, and how often each K and
// V fragment loaded from shared memory is reused (once per m16 tile a warp
// owns). The shapes below are the ones FlashAttention-2's own launch
// templates weigh (flash_fwd_launch_template.h) for each head dimension,
// around stage 07's choice.
//
// Each shape runs through the harness the CLI uses (DeviceRun: inputs rounded
// to bf16, outputs poisoned, L2 flushed before every timed run, median and
// p20/p80 of CUDA-event timings) on the paper's sweep settings (B = 16384/N,
// H = 2048/d), and is checked against the fp64 reference on sampled rows by
// check_forward, FlashAttention's rule for bf16. One CSV row per (shape,
// problem) on stdout, progress on stderr; tests/bench/tiles.py adds the GPU,
// driver, date and commit and writes docs/results/tiles.csv.
//
//   build/tests/bench/flashstep_tile_sweep [--d 64,128,256] [--N 1024,4096,16384]
//       [--causal both|yes|no] [--warmup N] [--iters N]
//
// Without a usable CUDA device it says why in one line and exits non-zero.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "07_tensor_core/tensor_core.h"
#include "07_tensor_core/tensor_core_launch.cuh"
#include "bench_tool.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/launch.cuh"

namespace {

using namespace flashstep;
using namespace flashstep::bench;
using tensor_core::Config;
using tensor_core::Step;

// More timed runs than sweep.py's: shapes differ by a few per cent, and a
// run of this kernel takes milliseconds at most.
constexpr int kDefaultWarmup = 3;
constexpr int kDefaultIters = 20;

// One shape: stage 07's kernel with Config<d, kTunedTiles, Br, Bc, Warps>,
// launched by the stage's own launch_config (tensor_core_launch.cuh).
template <int kHeadDim, int kBr, int kBc, int kWarps>
struct Shape {
  using Elem = __nv_bfloat16;
  using C = Config<kHeadDim, Step::kTunedTiles, kBr, kBc, kWarps>;
  static constexpr auto kernel = tensor_core::tensor_core_kernel<Elem, C>;
  static constexpr std::size_t kSmemBytes = C::kSmemElems * sizeof(Elem);

  static void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
    validate(p);
    if (p.dtype != DType::kBf16) throw Error("tile sweep: bf16 only");
    if (head_dim_bucket(p.d) != kHeadDim) throw Error("tile sweep: d outside this shape's bucket");
    tensor_core::launch_config<Elem, C>(p, t, stream, "tile sweep kernel");
  }

  // Registers per thread and resident blocks per SM, as the driver sees them.
  static void facts(int* registers, int* blocks_per_sm) {
    cudaFuncAttributes attr{};
    cuda_check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes");
    *registers = attr.numRegs;
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmemBytes)),
               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, C::kThreads,
                                                             kSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  }
};

struct TileRun {
  int d, br, bc, warps;
  ForwardFn forward;
  void (*facts)(int*, int*);
  std::size_t smem_bytes;
};

template <int kHeadDim, int kBr, int kBc, int kWarps>
constexpr TileRun tile() {
  using S = Shape<kHeadDim, kBr, kBc, kWarps>;
  return {kHeadDim, kBr, kBc, kWarps, S::forward, S::facts, S::kSmemBytes};
}

// Per head dimension: stage 07's shape (tile_shape(d, kTunedTiles)) and the
// alternatives FlashAttention-2 weighs: shorter or longer K/V tiles, fewer
// rows per block, twice the warps on the same rows. Eleven instantiations of
// the kernel, the build's slowest file after the stage's own.
constexpr TileRun kTiles[] = {
    tile<64, 128, 128, 4>(),  tile<64, 128, 64, 4>(),  tile<64, 64, 64, 4>(),
    tile<64, 128, 128, 8>(),  tile<128, 128, 64, 4>(), tile<128, 128, 32, 4>(),
    tile<128, 64, 64, 4>(),   tile<128, 128, 128, 8>(), tile<256, 64, 64, 4>(),
    tile<256, 64, 32, 4>(),   tile<256, 128, 64, 8>(),
};

std::string shape_name(const TileRun& t) {
  return std::to_string(t.br) + "x" + std::to_string(t.bc) + "w" + std::to_string(t.warps);
}

bool is_stage_shape(const TileRun& t) {
  const tensor_core::TileShape s = tensor_core::tile_shape(t.d, Step::kTunedTiles);
  return s.br == t.br && s.bc == t.bc && s.warps == t.warps;
}

struct Options {
  std::vector<int> d = {64, 128, 256};
  std::vector<std::int64_t> N = {1024, 4096, 16384};
  std::vector<bool> causal = {false, true};
  int warmup = kDefaultWarmup;
  int iters = kDefaultIters;
};

const char* const kUsage =
    "usage: flashstep_tile_sweep [--d 64,128,256] [--N 1024,4096,16384]\n"
    "                            [--causal both|yes|no] [--warmup N] [--iters N]\n"
    "Runs stage 07's kernel at each tile shape of the listed head dimensions on the\n"
    "paper's settings (B = 16384/N, H = 2048/d, bf16), checks it against the fp64\n"
    "reference on sampled rows and times it; one CSV row per shape and problem.\n";

Options parse(int argc, char** argv) {
  Options o;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--d") {
      o.d = parse_list<int>(flag, value);
      for (int d : o.d) {
        if (d != 64 && d != 128 && d != 256) throw Error("--d: 64, 128 or 256, not " + value);
      }
    } else if (flag == "--N") {
      o.N = parse_list<std::int64_t>(flag, value);
    } else if (flag == "--causal") {
      if (value == "both") o.causal = {false, true};
      else if (value == "yes") o.causal = {true};
      else if (value == "no") o.causal = {false};
      else throw Error("--causal: both, yes or no, not " + value);
    } else {
      return take_repeats(flag, value, o.warmup, o.iters);
    }
    return true;
  });
  return o;
}

int run(const Options& o) {
  std::string why;
  if (!cuda_device_available(&why)) throw Error("no usable CUDA device (" + why + ")");
  std::cout << "d,Br,Bc,warps,stage shape,dtype,B,H,N,causal,check,max err O,median ms,p20 ms,"
               "p80 ms,TFLOP/s,registers,smem bytes,blocks per SM,note\n";
  int failures = 0;
  for (int d : o.d) {
    for (std::int64_t N : o.N) {
      Problem p;
      p.B = std::max<std::int64_t>(kTokens / N, 1);
      p.H = kHidden / d;
      p.Nq = p.Nk = N;
      p.d = d;
      p.dtype = DType::kBf16;
      const Inputs in = random_inputs(p, kSeed);
      for (bool causal : o.causal) {
        p.causal = causal;
        const ForwardTruth truth = forward_truth(p, in, reference_row_step(p));
        for (const TileRun& t : kTiles) {
          if (t.d != d) continue;
          const std::string name = "07_tiles_" + std::to_string(d) + "_" + shape_name(t);
          Stage s;
          s.name = name;
          s.title = "stage 07 at another tile shape";
          s.writes_lse = true;
          s.forward = t.forward;
          s.workspace_bytes = [](const Problem&) -> std::int64_t { return 0; };
          s.dtypes = {DType::kBf16};
          s.backward_dtypes = {};
          std::string status = "error", err_o, note;
          Timing timing;
          int registers = 0, blocks_per_sm = 0;
          try {
            t.facts(&registers, &blocks_per_sm);
            DeviceRun dev(s, p, in.Q.data(), in.K.data(), in.V.data());
            std::vector<float> O, L;
            dev.run(O, L);
            const ForwardCheck check = check_forward(p, O.data(), L.data(), truth);
            status = check.ok() ? "ok" : "FAIL";
            err_o = sig(check.O.max_abs_error, 2);
            if (!check.ok()) note = check.summary();
            timing = dev.time(o.warmup, o.iters);
          } catch (const Error& e) {
            note = e.what();
          }
          failures += status != "ok";
          const bool timed = timing.iterations > 0;
          const double tflops = timed ? p.forward_flops() / (timing.median_ms / kMsPerS) / kTera : 0;
          std::cerr << "tile sweep: d=" << d << " N=" << N << (causal ? " causal " : " ")
                    << shape_name(t) << ": " << status
                    << (timed ? ", " + sig(timing.median_ms, 4) + " ms, " + sig(tflops, 4) +
                                    " TFLOP/s"
                              : "")
                    << (note.empty() ? "" : " (" + note + ")") << "\n";
          // Notes lose their commas and line breaks: one CSV field, one line.
          std::replace(note.begin(), note.end(), ',', ';');
          std::replace(note.begin(), note.end(), '\n', ' ');
          std::cout << d << "," << t.br << "," << t.bc << "," << t.warps << ","
                    << (is_stage_shape(t) ? 1 : 0) << ",bf16," << p.B << "," << p.H << "," << N
                    << "," << (causal ? 1 : 0) << "," << status << "," << err_o << ","
                    << (timed ? sig(timing.median_ms, 4) : "") << ","
                    << (timed ? sig(timing.p20_ms, 4) : "") << ","
                    << (timed ? sig(timing.p80_ms, 4) : "") << ","
                    << (timed ? sig(tflops, 4) : "") << "," << registers << "," << t.smem_bytes
                    << "," << blocks_per_sm << "," << note << std::endl;
        }
      }
    }
  }
  return failures ? kExitFailed : kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return tool_main(argc, argv, "flashstep_tile_sweep", kUsage, parse, run);
}
