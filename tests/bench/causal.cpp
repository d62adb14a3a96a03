// flashstep_causal: FlashAttention-2's causal lesson, measured. The fp32 tiled
// stages (03, 04, 05, 06 split-Q and split-K) run in each causal mode of
// common/tile_mask.h through their own launchers (no registry entries, no
// forked kernels):
//
//   fast        skip the K/V tiles wholly above the diagonal, test the mask only
//               in the tiles that cross it (or an end): what users get
//   no_skip     skipping off: every tile visited, the ones above the diagonal
//               masked score by score
//   mask_every  diagonal-only masking off: every score of every visited tile
//               tested (what the stages did before)
//
// plus the non-causal problem in fast and mask_every (the FlashAttention-2
// paper's 1.7-1.8x for skipping is against attention without the mask).
// Stage 03 (FlashAttention-1) visits every tile in every mode: no no_skip row.
//
// Each run goes through the harness the CLI uses (DeviceRun: outputs poisoned,
// L2 flushed before every timed run, median and p20/p80 of CUDA-event
// timings) on the paper's settings (B = 16384/N, H = 2048/d), checked against
// the fp64 reference on sampled rows. One CSV row per (stage, problem, mode)
// on stdout, progress on stderr; tests/bench/causal.py adds the GPU, driver,
// date and commit and writes docs/results/causal.csv.
//
//   build/tests/bench/flashstep_causal [--d 64,128] [--N 512,...,16384]
//       [--warmup N] [--iters N]
//   build/tests/bench/flashstep_causal --ragged
//
// --ragged is the correctness test of the modes (CTest gpu.causal_modes): the
// shared ragged grid (tests/shapes.h), causal and not, every stage in every
// mode against the fp64 reference on every row, outputs poisoned, and each
// mode's O and L bit for bit those of fast. Without a usable CUDA device it
// says why in one line and exits 77 (skipped) with --ragged, 1 otherwise.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "03_fa1_kv_outer/fa1_kv_outer.h"
#include "04_fa2_q_outer/fa2_q_outer.h"
#include "05_sequence_parallel/sequence_parallel.h"
#include "06_warp_split/warp_split.h"
#include "bench_tool.h"
#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/tile_mask.h"
#include "shapes.h"

namespace {

using namespace flashstep;
using namespace flashstep::bench;

// sweep.py's repeats for the short problems: a mode differs by per cents.
constexpr int kDefaultWarmup = 2;
constexpr int kDefaultIters = 10;

using ModeForward = void (*)(const Problem&, const ForwardTensors&, Stream, CausalMode);

// A registered stage's forward in one mode, as a registry ForwardFn.
template <ModeForward F, CausalMode M>
void in_mode(const Problem& p, const ForwardTensors& t, Stream stream) {
  F(p, t, stream, M);
}

struct Mode {
  CausalMode mode;
  const char* name;
};
constexpr Mode kModes[] = {{CausalMode::kFast, "fast"},
                           {CausalMode::kNoSkip, "no_skip"},
                           {CausalMode::kMaskEvery, "mask_every"}};

// One stage: its registry name and its forward in each mode of kModes.
struct Entry {
  const char* name;
  bool skips;  // whether it skips tiles at all (stage 03 visits every tile)
  ForwardFn forward[3];
};

template <ModeForward F>
constexpr Entry entry(const char* name, bool skips) {
  return {name,
          skips,
          {in_mode<F, CausalMode::kFast>, in_mode<F, CausalMode::kNoSkip>,
           in_mode<F, CausalMode::kMaskEvery>}};
}

const Entry kEntries[] = {
    entry<fa1_kv_outer::forward>("03_fa1_kv_outer", false),
    entry<fa2_q_outer::forward>("04_fa2_q_outer", true),
    entry<sequence_parallel::forward>("05_sequence_parallel", true),
    entry<warp_split::forward_split_q>("06_warp_split_q", true),
    entry<warp_split::forward_split_k>("06_warp_split_k", true),
};

// The modes a problem runs in: causal all three (no_skip only where the stage
// skips); non-causal fast and mask_every (no tile to skip).
bool runs(const Entry& e, const Problem& p, CausalMode mode) {
  if (mode != CausalMode::kNoSkip) return true;
  return p.causal && e.skips;
}

// The registered stage `name` with its forward replaced by the mode's.
Stage with_forward(const char* name, ForwardFn forward) {
  Stage copy = *select_stages(name).front();  // throws if `name` is not registered
  copy.forward = forward;
  return copy;
}

struct Options {
  std::vector<int> d = {64, 128};
  std::vector<std::int64_t> N = {512, 1024, 2048, 4096, 8192, 16384};
  int warmup = kDefaultWarmup;
  int iters = kDefaultIters;
  bool ragged = false;
};

const char* const kUsage =
    "usage: flashstep_causal [--d 64,128] [--N 512,1024,2048,4096,8192,16384]\n"
    "                        [--warmup N] [--iters N]\n"
    "       flashstep_causal --ragged\n"
    "Runs the fp32 tiled stages (03-06) in each causal mode (fast, no_skip: tile\n"
    "skipping off, mask_every: diagonal-only masking off) on the paper's settings\n"
    "(B = 16384/N, H = 2048/d), causal and not, checks each result against the fp64\n"
    "reference on sampled rows and times it; one CSV row per stage, problem and mode.\n"
    "--ragged: every mode on the ragged test grid, checked on every row and against\n"
    "fast bit for bit (exit 77 without a GPU).\n";

Options parse(int argc, char** argv) {
  Options o;
  for_each_flag(
      argc, argv,
      [&](const std::string& flag, const std::string& value) {
        if (flag == "--ragged") {
          o.ragged = true;
        } else if (flag == "--d") {
          o.d = parse_list<int>(flag, value);
          for (int d : o.d) {
            if (d > kMaxHeadDim) throw Error("--d: at most 256, not " + value);
          }
        } else if (flag == "--N") {
          o.N = parse_list<std::int64_t>(flag, value);
        } else {
          return take_repeats(flag, value, o.warmup, o.iters);
        }
        return true;
      },
      {"--ragged"});
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The ragged grid in every mode: the reference on every row, and fast's bits.
int run_ragged() {
  int failures = 0, checks = 0;
  std::uint64_t seed = 1900;
  for (const Problem& p : test::ragged_problems()) {
    const Inputs in = random_inputs(p, seed++);
    const ForwardTruth truth = forward_truth(p, in);
    for (const Entry& e : kEntries) {
      std::vector<float> O_fast, L_fast;
      for (int m = 0; m < 3; ++m) {
        const Stage s = with_forward(e.name, e.forward[m]);
        DeviceRun dev(s, p, in.Q.data(), in.K.data(), in.V.data());
        std::vector<float> O, L;
        dev.run(O, L);
        const ForwardCheck check = check_forward(p, O.data(), L.data(), truth);
        std::string why = check.ok() ? "" : check.summary();
        if (m == 0) {
          O_fast = O;
          L_fast = L;
        } else if (why.empty() && !(same_bits(O, O_fast) && same_bits(L, L_fast))) {
          why = "O or L differs from the fast mode's bits";
        }
        ++checks;
        if (!why.empty()) {
          ++failures;
          std::cerr << "flashstep_causal: FAIL " << e.name << " " << kModes[m].name << " "
                    << p.describe() << ": " << why << "\n";
        }
      }
    }
  }
  std::cerr << "flashstep_causal: ragged grid, " << checks << " runs, " << failures
            << " failed\n";
  return failures ? kExitFailed : kExitOk;
}

int run_sweep(const Options& o) {
  std::cout << "stage,mode,B,H,N,d,causal,check,max err O,max err L,median ms,p20 ms,p80 ms,"
               "TFLOP/s,mask_tests,skipped_tiles,note\n";
  int failures = 0;
  for (int d : o.d) {
    for (std::int64_t N : o.N) {
      Problem p;
      p.B = std::max<std::int64_t>(kTokens / N, 1);
      p.H = std::max<std::int64_t>(kHidden / d, 1);
      p.Nq = p.Nk = N;
      p.d = d;
      const Inputs in = random_inputs(p, kSeed);
      for (bool causal : {false, true}) {
        p.causal = causal;
        const ForwardTruth truth = forward_truth(p, in, reference_row_step(p));
        for (const Entry& e : kEntries) {
          for (int m = 0; m < 3; ++m) {
            if (!runs(e, p, kModes[m].mode)) continue;
            std::string status = "error", err_o, err_l, note;
            Timing timing;
            Cost modelled;
            try {
              const Stage s = with_forward(e.name, e.forward[m]);
              modelled = s.model(p);
              DeviceRun dev(s, p, in.Q.data(), in.K.data(), in.V.data());
              std::vector<float> O, L;
              dev.run(O, L);
              const ForwardCheck check = check_forward(p, O.data(), L.data(), truth);
              status = check.ok() ? "ok" : "FAIL";
              err_o = sig(check.O.max_abs_error, 2);
              if (check.L) err_l = sig(check.L->max_abs_error, 2);
              if (!check.ok()) note = check.summary();
              timing = dev.time(o.warmup, o.iters);
            } catch (const Error& err) {
              note = err.what();
            }
            failures += status != "ok";
            const bool timed = timing.iterations > 0;
            const double tflops =
                timed ? p.forward_flops() / (timing.median_ms / kMsPerS) / kTera : 0;
            std::cerr << "causal: " << e.name << " " << kModes[m].name << " d=" << d
                      << " N=" << N << (causal ? " causal" : "") << ": " << status
                      << (timed ? ", " + sig(timing.median_ms, 4) + " ms, " + sig(tflops, 4) +
                                      " TFLOP/s"
                                : "")
                      << (note.empty() ? "" : " (" + note + ")") << "\n";
            // Notes lose their commas and line breaks: one CSV field, one line.
            std::replace(note.begin(), note.end(), ',', ';');
            std::replace(note.begin(), note.end(), '\n', ' ');
            // The model's counts are fast mode's (the registry's model); the
            // other modes' differ as fa2::model(p, blocks, mode) says.
            const bool fast = kModes[m].mode == CausalMode::kFast;
            std::cout << e.name << "," << kModes[m].name << "," << p.B << "," << p.H << "," << N
                      << "," << d << "," << (causal ? 1 : 0) << "," << status << "," << err_o
                      << "," << err_l << "," << (timed ? sig(timing.median_ms, 4) : "") << ","
                      << (timed ? sig(timing.p20_ms, 4) : "") << ","
                      << (timed ? sig(timing.p80_ms, 4) : "") << ","
                      << (timed ? sig(tflops, 4) : "") << ","
                      << (fast ? std::to_string(modelled.mask_tests) : "") << ","
                      << (fast ? std::to_string(modelled.skipped_tiles) : "") << "," << note
                      << std::endl;
          }
        }
      }
    }
  }
  return failures ? kExitFailed : kExitOk;
}

// The ragged check or the sweep; without a usable device, skipped (exit 77)
// for the ragged check, which is a CTest test, failed for the sweep.
int run(const Options& o) {
  if (!device_usable("flashstep_causal")) return o.ragged ? kExitSkipped : kExitFailed;
  return o.ragged ? run_ragged() : run_sweep(o);
}

}  // namespace

int main(int argc, char** argv) {
  return tool_main(argc, argv, "flashstep_causal", kUsage, parse, run);
}
