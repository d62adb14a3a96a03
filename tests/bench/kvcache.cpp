// flashstep_kvcache: what a paged KV cache and an append in the same call
// cost stage 09's decoding, measured. Each decode point (Nq = 1, H = 32,
// d = 128) runs split_kv::forward_kvcache on the same keys in five ways:
//
//   contiguous          [B, H_kv, Nk, d], every sequence holding Nk keys
//   paged64, paged256   [pages, H_kv, page_keys, d], pages of 64 or 256 keys
//                       taken from the pool in a shuffled order
//   contiguous+append,  the cache holds Nk - Nq keys and the call appends the
//   paged256+append     last Nq (the same values), so that the attention sees
//                       the same Nk keys as the others, and the same check
//                       holds: the append's own kernel is the difference
//
// Each is checked against the fp64 reference on sampled rows (outputs
// poisoned first) and timed as the CLI times (time_calls: L2 flushed before
// each run, median and p20/p80 of CUDA events). One CSV row per (point,
// layout) on stdout, progress on stderr; tests/bench/kvcache.py adds the GPU,
// driver, date and commit and writes docs/results/kvcache.csv.
//
//   build/tests/bench/flashstep_kvcache [--dtype bf16,fp32] [--H-kv 1,8,32]
//       [--B 1,8] [--Nk 4096,32768,262144] [--warmup N] [--iters N]
//
// Without a usable CUDA device it says why in one line and exits 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "09_split_kv/split_kv.h"
#include "bench_tool.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/problem.h"

namespace {

using namespace flashstep;
using namespace flashstep::bench;

// decode.py's decoding shape: the query heads of a Llama-style model, one new
// token, d = 128.
constexpr std::int64_t kHeads = 32;
constexpr std::int64_t kNewTokens = 1;
constexpr std::int64_t kHeadDim = 128;
// Points whose K and V pass this many bytes (in their type) are left out, as
// decode.py's --max-kv-gb leaves them: the host holds them in fp32 twice.
constexpr double kMaxKvBytes = 4e9;
// decode.py's repeats: a decode at the copy ceiling is tens of microseconds.
constexpr int kDefaultWarmup = 5;
constexpr int kDefaultIters = 30;
constexpr double kGiga = 1e9;
// The page sizes: the smallest the kernels take (a tile never straddles two
// pages) and FlashAttention-2's, 256.
constexpr std::int64_t kSmallPage = split_kv::kPageKeyMultiple;
constexpr std::int64_t kLargePage = 256;

struct Options {
  std::vector<DType> dtypes = {DType::kBf16, DType::kFp32};
  std::vector<std::int64_t> H_kv = {1, 8, 32};
  std::vector<std::int64_t> B = {1, 8};
  std::vector<std::int64_t> Nk = {4096, 32768, 262144};
  int warmup = kDefaultWarmup;
  int iters = kDefaultIters;
};

const char* const kUsage =
    "usage: flashstep_kvcache [--dtype bf16,fp32] [--H-kv 1,8,32] [--B 1,8]\n"
    "                         [--Nk 4096,32768,262144] [--warmup N] [--iters N]\n"
    "Runs stage 09's KV-cache decode (Nq = 1, H = 32, d = 128) with a contiguous\n"
    "cache, a paged one (pages of 64 and 256 keys in a shuffled order), and with\n"
    "the last token appended in the same call; checks each against the fp64\n"
    "reference on sampled rows and times it; one CSV row per point and layout.\n";

Options parse(int argc, char** argv) {
  Options o;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--dtype") {
      o.dtypes.clear();
      std::stringstream s(value);
      std::string item;
      while (std::getline(s, item, ',')) o.dtypes.push_back(parse_dtype(item));
      if (o.dtypes.empty()) throw Error("--dtype: empty list");
    } else if (flag == "--H-kv") {
      o.H_kv = parse_list<std::int64_t>(flag, value);
      for (std::int64_t h : o.H_kv) {
        if (kHeads % h != 0) throw Error("--H-kv " + std::to_string(h) + ": must divide H = 32");
      }
    } else if (flag == "--B") {
      o.B = parse_list<std::int64_t>(flag, value);
    } else if (flag == "--Nk") {
      o.Nk = parse_list<std::int64_t>(flag, value);
      for (std::int64_t n : o.Nk) {
        if (n % kLargePage != 0) {
          throw Error("--Nk " + std::to_string(n) + ": must be a multiple of 256 (whole pages)");
        }
      }
    } else {
      return take_repeats(flag, value, o.warmup, o.iters);
    }
    return true;
  });
  return o;
}

// A device buffer of `bytes`, freed on scope exit.
struct Buffer {
  void* ptr = nullptr;
  explicit Buffer(std::int64_t bytes, const char* what) {
    cuda_check(cudaMalloc(&ptr, static_cast<size_t>(std::max<std::int64_t>(bytes, 4))), what);
  }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// One way of holding and feeding the cache.
struct Layout {
  const char* name;
  std::int64_t page_keys;  // 0: contiguous
  bool append;
};
constexpr Layout kLayouts[] = {{"contiguous", 0, false},
                               {"paged64", kSmallPage, false},
                               {"paged256", kLargePage, false},
                               {"contiguous+append", 0, true},
                               {"paged256+append", kLargePage, true}};

// The pool of a paged cache: K or V ([B, H_kv, Nk, d]) in pages of
// page_keys keys, sequence b's p-th page at pool page table[b, p].
std::vector<float> to_pages(const Problem& p, const std::vector<float>& X,
                            const std::vector<std::int32_t>& table, std::int64_t page_keys) {
  std::vector<float> pool(X.size());
  const std::int64_t pages_per_seq = p.Nk / page_keys, H_kv = p.kv_heads();
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < H_kv; ++h) {
      for (std::int64_t pg = 0; pg < pages_per_seq; ++pg) {
        const std::int64_t page = table[static_cast<size_t>(b * pages_per_seq + pg)];
        const std::int64_t from = ((b * H_kv + h) * p.Nk + pg * page_keys) * p.d;
        const std::int64_t to = (page * H_kv + h) * page_keys * p.d;
        std::copy(X.begin() + from, X.begin() + from + page_keys * p.d, pool.begin() + to);
      }
    }
  }
  return pool;
}

// The last Nq keys of each sequence of X ([B, H_kv, Nk, d]): [B, H_kv, Nq, d].
std::vector<float> last_keys(const Problem& p, const std::vector<float>& X) {
  std::vector<float> out;
  for (std::int64_t kvh = 0; kvh < p.B * p.kv_heads(); ++kvh) {
    const std::int64_t from = (kvh * p.Nk + p.Nk - p.Nq) * p.d;
    out.insert(out.end(), X.begin() + from, X.begin() + from + p.Nq * p.d);
  }
  return out;
}

int run_sweep(const Options& o) {
  std::cout << "dtype,B,H,H_kv,Nq,Nk,d,layout,page_keys,append,check,max err O,median ms,p20 ms,"
               "p80 ms,GB/s,note\n";
  int failures = 0;
  std::uint64_t seed = kSeed;
  for (DType t : o.dtypes) {
    for (std::int64_t H_kv : o.H_kv) {
      for (std::int64_t B : o.B) {
        for (std::int64_t Nk : o.Nk) {
          Problem p;
          p.B = B;
          p.H = kHeads;
          p.H_kv = H_kv;
          p.Nq = kNewTokens;
          p.Nk = Nk;
          p.d = kHeadDim;
          p.causal = true;  // the new token sees every cached key and itself
          p.dtype = t;
          if (2.0 * static_cast<double>(p.kv_elems() * p.elem_bytes()) > kMaxKvBytes) continue;
          const Inputs in = random_inputs(p, seed++);
          const ForwardTruth truth = forward_truth(p, in, reference_row_step(p));
          const std::int64_t E = p.elem_bytes(), kv = p.kv_elems();
          const double bytes = static_cast<double>(split_kv::model(p).hbm_bytes());
          Buffer Q(p.q_elems() * E, "cudaMalloc Q"), O(p.q_elems() * E, "cudaMalloc O"),
              L(p.lse_elems() * 4, "cudaMalloc L"), K(kv * E, "cudaMalloc K"),
              V(kv * E, "cudaMalloc V"), K_new(p.q_elems() / p.group() * E, "cudaMalloc K_new"),
              V_new(p.q_elems() / p.group() * E, "cudaMalloc V_new"),
              lens(p.B * 4, "cudaMalloc seqlens"),
              table(Nk / kSmallPage * p.B * 4, "cudaMalloc table"),
              work(split_kv::workspace_bytes(p), "cudaMalloc workspace");
          copy_to_device(Q.ptr, in.Q.data(), p.q_elems(), t, "copy Q");
          const std::vector<float> K_last = last_keys(p, in.K), V_last = last_keys(p, in.V);
          copy_to_device(K_new.ptr, K_last.data(), static_cast<std::int64_t>(K_last.size()), t,
                         "copy K_new");
          copy_to_device(V_new.ptr, V_last.data(), static_cast<std::int64_t>(V_last.size()), t,
                         "copy V_new");
          for (const Layout& lay : kLayouts) {
            std::string status = "error", err_o, note;
            Timing timing;
            try {
              // The cache's keys, in place: contiguous, or pages shuffled.
              std::vector<std::int32_t> pages;
              if (lay.page_keys) {
                pages.resize(static_cast<size_t>(p.B * (Nk / lay.page_keys)));
                std::iota(pages.begin(), pages.end(), 0);
                std::shuffle(pages.begin(), pages.end(), std::mt19937_64(seed));
                copy_to_device(K.ptr, to_pages(p, in.K, pages, lay.page_keys).data(), kv, t,
                               "copy K");
                copy_to_device(V.ptr, to_pages(p, in.V, pages, lay.page_keys).data(), kv, t,
                               "copy V");
                cuda_check(
                    cudaMemcpy(table.ptr, pages.data(), pages.size() * 4, cudaMemcpyHostToDevice),
                    "copy table");
              } else {
                copy_to_device(K.ptr, in.K.data(), kv, t, "copy K");
                copy_to_device(V.ptr, in.V.data(), kv, t, "copy V");
              }
              const std::vector<std::int32_t> held(
                  static_cast<size_t>(p.B), static_cast<std::int32_t>(lay.append ? Nk - p.Nq : Nk));
              cuda_check(cudaMemcpy(lens.ptr, held.data(), held.size() * 4, cudaMemcpyHostToDevice),
                         "copy seqlens");
              ForwardTensors ft;
              ft.Q = Q.ptr;
              ft.O = O.ptr;
              ft.L = static_cast<float*>(L.ptr);
              ft.workspace = work.ptr;
              split_kv::KvCache cache;
              cache.K = K.ptr;
              cache.V = V.ptr;
              cache.seqlens = static_cast<const std::int32_t*>(lens.ptr);
              if (lay.page_keys) {
                cache.layout = {static_cast<const std::int32_t*>(table.ptr), Nk / lay.page_keys,
                                lay.page_keys};
              }
              if (lay.append) {
                cache.K_new = K_new.ptr;
                cache.V_new = V_new.ptr;
              }
              auto call = [&] { split_kv::forward_kvcache(p, ft, cache, nullptr); };
              cuda_check(cudaMemset(O.ptr, 0xFF, static_cast<size_t>(p.q_elems() * E)), "poison O");
              cuda_check(cudaMemset(L.ptr, 0xFF, static_cast<size_t>(p.lse_elems() * 4)),
                         "poison L");
              call();
              cuda_check(cudaDeviceSynchronize(), "stage 09 forward_kvcache");
              std::vector<float> got_O, got_L;
              copy_to_host(got_O, O.ptr, p.q_elems(), t, "copy O");
              copy_to_host(got_L, L.ptr, p.lse_elems(), DType::kFp32, "copy L");
              const ForwardCheck check = check_forward(p, got_O.data(), got_L.data(), truth);
              status = check.ok() ? "ok" : "FAIL";
              err_o = sig(check.O.max_abs_error, 2);
              if (!check.ok()) note = check.summary();
              timing = time_calls(call, o.warmup, o.iters, "stage 09 forward_kvcache");
            } catch (const Error& err) {
              note = err.what();
            }
            failures += status != "ok";
            const bool timed = timing.iterations > 0;
            const double gbs = timed ? bytes / (timing.median_ms / kMsPerS) / kGiga : 0;
            std::cerr << "kvcache: " << dtype_name(t) << " B=" << B << " H_kv=" << H_kv
                      << " Nk=" << Nk << " " << lay.name << ": " << status
                      << (timed ? ", " + sig(timing.median_ms * kMsPerS, 4) + " us, " +
                                      sig(gbs, 4) + " GB/s"
                                : "")
                      << (note.empty() ? "" : " (" + note + ")") << "\n";
            std::replace(note.begin(), note.end(), ',', ';');
            std::replace(note.begin(), note.end(), '\n', ' ');
            std::cout << dtype_name(t) << "," << B << "," << kHeads << "," << H_kv << "," << p.Nq
                      << "," << Nk << "," << p.d << "," << lay.name << "," << lay.page_keys << ","
                      << (lay.append ? 1 : 0) << "," << status << "," << err_o << ","
                      << (timed ? sig(timing.median_ms, 4) : "") << ","
                      << (timed ? sig(timing.p20_ms, 4) : "") << ","
                      << (timed ? sig(timing.p80_ms, 4) : "") << "," << (timed ? sig(gbs, 4) : "")
                      << "," << note << std::endl;
          }
        }
      }
    }
  }
  return failures ? kExitFailed : kExitOk;
}

int run(const Options& o) { return device_usable("flashstep_kvcache") ? run_sweep(o) : kExitFailed; }

}  // namespace

int main(int argc, char** argv) {
  return tool_main(argc, argv, "flashstep_kvcache", kUsage, parse, run);
}
