// Stage 10 on the GPUs: ring attention over every visible GPU (and over 2
// where more are visible) against the fp64 reference on ragged lengths that
// no GPU count divides, causal and not, contiguous and zig-zag, with the
// partials from stage 07 (bf16, fp16) and the fp32 stages 04, 05 and 06;
// outputs and partials poisoned before each run. Also: the bytes handed to
// NCCL against the model, run-to-run determinism, and the timing's figures.
//
// Needs NCCL (built only where CMake found it) and at least 2 GPUs: with
// fewer it prints why and exits FLASHSTEP_SKIP_EXIT, which CTest reports as
// skipped, not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/stage.h"
#include "ring_model.h"
#include "ring_runner.h"
#include "ring_schedule.h"
#include "shapes.h"

using flashstep::DType;
using flashstep::Problem;
using flashstep::ring::Assign;
using flashstep::ring::RingRun;
using flashstep::ring::Schedule;

namespace {

constexpr int kMinGpus = 2;

// The stage of that exact name (select_stages throws for an unknown one).
const flashstep::Stage& stage_named(std::string_view name) {
  return *flashstep::select_stages(name).front();
}

// The ring sizes to test: every visible GPU, and 2 when more are visible.
std::vector<int> ring_sizes() {
  const int visible = flashstep::ring::visible_gpus();
  std::vector<int> out = {visible};
  if (visible > kMinGpus) out.push_back(kMinGpus);
  return out;
}

struct Case {
  const char* stage;
  DType t;
  bool every_shape;  // the whole grid, or its first two lengths
};

}  // namespace

TEST_CASE("ring attention on the GPUs matches the fp64 reference on ragged lengths") {
  // Lengths no GPU count divides (and 1, shorter than any ring), each with
  // another head dimension of the ragged grid.
  const std::int64_t lengths[] = {1, 17, 97, 113, 203, 1023};
  const std::int64_t dims[] = {1, 40, 59, 111, 128, 256};
  std::uint64_t seed = 18000;
  for (const Case& cs : {Case{"07_tensor_core", DType::kBf16, true},
                         Case{"05_sequence_parallel", DType::kFp32, true},
                         Case{"07_tensor_core", DType::kFp16, false},
                         Case{"06_warp_split_q", DType::kFp32, false},
                         Case{"04_fa2_q_outer", DType::kFp32, false}}) {
    const flashstep::Stage& stage = stage_named(cs.stage);
    for (int P : ring_sizes()) {
      for (size_t k = 0; k < (cs.every_shape ? std::size(lengths) : 2); ++k) {
        for (Assign a : {Assign::kContiguous, Assign::kZigzag}) {
          for (bool causal : {false, true}) {
            Problem p = flashstep::test::make_problem(k % 2 ? 1 : 2, k % 2 ? 2 : 1, lengths[k],
                                                      lengths[k], dims[k], causal);
            p.dtype = cs.t;
            const Schedule s(p.Nq, P, a, causal);
            CAPTURE(cs.stage);
            CAPTURE(p.describe());
            CAPTURE(P);
            CAPTURE(assign_name(a));
            const auto in = flashstep::random_inputs(p, seed++);  // fresh data for every check
            RingRun run(p, s, stage, true, in);
            std::vector<float> O, L;
            run.run(O, L);
            const auto c = flashstep::check_forward(p, O.data(), L.data(),
                                                    flashstep::forward_truth(p, in));
            CHECK_MESSAGE(c.ok(), c.summary());
          }
        }
      }
    }
  }
}

TEST_CASE("ring attention without overlap gives the same bits, and bytes sent match the model") {
  // The no-overlap order changes when transfers run, not what is computed;
  // nothing in the ring accumulates in a run-dependent order, so a second
  // run gives the same bits too.
  const flashstep::Stage& stage = stage_named("07_tensor_core");
  for (int P : ring_sizes()) {
    for (Assign a : {Assign::kContiguous, Assign::kZigzag}) {
      Problem p = flashstep::test::make_problem(1, 3, 2049, 2049, 64, true);
      p.dtype = DType::kBf16;
      const Schedule s(p.Nq, P, a, true);
      CAPTURE(P);
      CAPTURE(assign_name(a));
      const auto in = flashstep::random_inputs(p, 19);
      std::vector<float> O1, L1, O2, L2, O3, L3;
      RingRun overlapped(p, s, stage, true, in);
      overlapped.run(O1, L1);
      overlapped.run(O2, L2);
      RingRun serial(p, s, stage, false, in);
      serial.run(O3, L3);
      CHECK(O1 == O2);
      CHECK(L1 == L2);
      CHECK(O1 == O3);
      CHECK(L1 == L3);
      const auto model = flashstep::ring::ring_cost(p, s, stage);
      const std::vector<std::int64_t> sent = overlapped.bytes_sent();
      REQUIRE(sent.size() == static_cast<size_t>(P));
      for (int r = 0; r < P; ++r) CHECK(sent[static_cast<size_t>(r)] == model[static_cast<size_t>(r)].bytes_sent);
    }
  }
}

TEST_CASE("ring timing: positive times, a hidden share in [0, 1], none hidden without overlap") {
  const flashstep::Stage& stage = stage_named("07_tensor_core");
  const int P = ring_sizes().front();
  Problem p = flashstep::test::make_problem(1, 8, 16384, 16384, 128, true);
  p.dtype = DType::kBf16;
  const Schedule s(p.Nq, P, Assign::kZigzag, true);
  const auto in = flashstep::random_inputs(p, 23);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    RingRun run(p, s, stage, overlap, in);
    const auto t = run.time(1, 3);
    CHECK(t.time.median_ms > 0.0);
    CHECK(t.comm_ms > 0.0);
    REQUIRE(t.compute_ms.size() == static_cast<size_t>(P));
    for (double c : t.compute_ms) CHECK(c > 0.0);
    CHECK(t.hidden >= 0.0);
    CHECK(t.hidden <= 1.0);
    // Serial: each transfer runs between two steps' compute, so almost none
    // of it overlaps (event timestamps have about 0.5 us of resolution).
    if (!overlap) CHECK(t.hidden < 0.05);
    MESSAGE("P = " << P << (overlap ? ", overlapped" : ", serial") << ": " << t.time.median_ms
                   << " ms, transfers " << t.comm_ms << " ms per GPU, hidden " << t.hidden);
  }
}

TEST_CASE("a ring of more GPUs than visible is one clear error") {
  const int visible = flashstep::ring::visible_gpus();
  Problem p = flashstep::test::make_problem(1, 1, 64, 64, 64, false);
  p.dtype = DType::kBf16;
  const auto in = flashstep::random_inputs(p, 1);
  CHECK_THROWS_WITH_AS(RingRun(p, Schedule(64, visible + 1, Assign::kZigzag, false),
                               stage_named("07_tensor_core"), true, in),
                       doctest::Contains("visible"), flashstep::Error);
}

int main(int argc, char** argv) {
  std::string why;
  if (!flashstep::cuda_device_available(&why)) {
    std::printf("ring GPU tests skipped: %s\n", why.c_str());
    return FLASHSTEP_SKIP_EXIT;
  }
  const int visible = flashstep::ring::visible_gpus();
  if (visible < kMinGpus) {
    std::printf("ring GPU tests skipped: %d GPU visible, a ring needs %d\n", visible, kMinGpus);
    return FLASHSTEP_SKIP_EXIT;
  }
  std::printf("GPUs: %d x %s\n", visible, flashstep::device_info().name.c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
