// Stage 10, ring attention, on the CPU: the schedule's reasoning checked
// against the global mask query by query, the ring simulated with P ranks in
// one process (the GPU runner's schedule, buffers and merge order) against
// the fp64 reference on ragged lengths, the model against what the
// simulation counted, the load balance of zig-zag assignment in numbers, and
// the command's argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "check_cost.h"
#include "common/check.h"
#include "common/error.h"
#include "common/stage.h"
#include "ring_cli.h"
#include "ring_model.h"
#include "ring_schedule.h"
#include "ring_simulation.h"
#include "shapes.h"

using flashstep::DType;
using flashstep::Problem;
using flashstep::ring::Assign;
using flashstep::ring::Buffer;
using flashstep::ring::Chunk;
using flashstep::ring::PairKind;
using flashstep::ring::Schedule;
using flashstep::test::make_problem;

namespace {

// Lengths not divisible by the rank counts below (and 1, shorter than any
// ring), and the rank counts the issue names.
const std::int64_t kLengths[] = {1, 2, 17, 97, 113, 203};
const int kRanks[] = {1, 2, 3, 4, 8};
const Assign kAssigns[] = {Assign::kContiguous, Assign::kZigzag};

const flashstep::Stage& stage_named(std::string_view name) {
  for (const flashstep::Stage& s : flashstep::all_stages()) {
    if (s.name == name) return s;
  }
  FAIL("stage " << name << " is not registered");
  throw;  // unreachable: FAIL throws
}

Problem ring_problem(std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t d, bool causal,
                     DType t = DType::kFp32) {
  Problem p = make_problem(B, H, N, N, d, causal);
  p.dtype = t;
  return p;
}

// The simulation's O and L against the fp64 reference, by p.dtype's rule.
flashstep::ForwardCheck check_simulation(const Problem& p, const flashstep::Inputs& in,
                                         const flashstep::ring::Simulation& sim) {
  return flashstep::check_forward(p, sim.O.data(), sim.L.data(), flashstep::forward_truth(p, in));
}

std::string describe(const Problem& p, const Schedule& s) {
  std::ostringstream o;
  o << p.describe() << " on " << s.ranks() << " ranks, " << assign_name(s.assign());
  return o.str();
}

}  // namespace

TEST_CASE("ring schedule: the chunks cut the sequence in order and each rank holds its own") {
  for (std::int64_t N : kLengths) {
    for (int P : kRanks) {
      for (Assign a : kAssigns) {
        const Schedule s(N, P, a, true);
        CAPTURE(N);
        CAPTURE(P);
        CAPTURE(assign_name(a));
        REQUIRE(s.chunk_count() == (a == Assign::kZigzag ? 2 * P : P));
        std::int64_t at = 0;
        for (int c = 0; c < s.chunk_count(); ++c) {
          CHECK(s.chunk(c).begin == at);
          CHECK(s.chunk(c).size() >= N / s.chunk_count());
          CHECK(s.chunk(c).size() <= N / s.chunk_count() + 1);
          CHECK(s.chunk(c).size() <= s.max_chunk_rows());
          at = s.chunk(c).end;
        }
        CHECK(at == N);
        std::vector<int> holder(static_cast<size_t>(s.chunk_count()), -1);
        for (int r = 0; r < P; ++r) {
          for (int c : s.held(r)) {
            CHECK(holder[static_cast<size_t>(c)] == -1);
            holder[static_cast<size_t>(c)] = r;
          }
          if (a == Assign::kZigzag) CHECK(s.held(r) == std::vector<int>{r, 2 * P - 1 - r});
        }
        CHECK(std::count(holder.begin(), holder.end(), -1) == 0);
      }
    }
  }
}

TEST_CASE("ring schedule: each chunk pair is fully visible, diagonal or fully masked, query by query") {
  // The reasoning the stage rests on (ring_schedule.h), checked for every
  // pair against the global bottom-right mask: a skipped pair has no visible
  // key, a full one has every key visible, and a diagonal one's own
  // bottom-right mask (row i of n_q sees keys j <= i + n_k - n_q of its n_k)
  // is the global mask restricted to the pair, row by row.
  for (std::int64_t N : kLengths) {
    for (int P : kRanks) {
      for (Assign a : kAssigns) {
        for (bool causal : {false, true}) {
          const Problem p = ring_problem(1, 1, N, 1, causal);
          const Schedule s(N, P, a, causal);
          CAPTURE(describe(p, s));
          for (int qa = 0; qa < s.chunk_count(); ++qa) {
            for (int kb = 0; kb < s.chunk_count(); ++kb) {
              const Chunk q = s.chunk(qa), k = s.chunk(kb);
              const PairKind kind = s.kind(qa, kb);
              CAPTURE(qa);
              CAPTURE(kb);
              std::int64_t visible = 0;
              bool local_is_global = q.size() == k.size();
              for (std::int64_t i = q.begin; i < q.end; ++i) {
                const std::int64_t seen =
                    std::clamp<std::int64_t>(p.visible_keys(i) - k.begin, 0, k.size());
                visible += seen;
                const std::int64_t local = std::min(k.size(), i - q.begin + 1 + k.size() - q.size());
                local_is_global = local_is_global && local == seen;
              }
              if (kind == PairKind::kSkip) CHECK(visible == 0);
              if (kind == PairKind::kFull) CHECK(visible == q.size() * k.size());
              if (kind == PairKind::kDiagonal) CHECK(local_is_global);
              // And the converse: what has keys to see is computed.
              if (visible > 0) CHECK(kind != PairKind::kSkip);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring schedule: every block arrives in the buffer the next step computes from") {
  for (int P : kRanks) {
    for (Assign a : kAssigns) {
      const Schedule s(1000, P, a, true);
      CAPTURE(P);
      CAPTURE(assign_name(a));
      for (int r = 0; r < P; ++r) {
        std::vector<int> seen;
        for (int t = 0; t < P; ++t) {
          const flashstep::ring::Step st = s.step(r, t);
          seen.push_back(st.origin);
          CHECK(st.transfers == (t < P - 1));
          CHECK(st.compute_from == (t == 0 ? Buffer::kOwn : s.step(r, t - 1).recv_into));
          if (!st.transfers) continue;
          // What rank r receives at step t is what its neighbour computes on
          // at step t, and what r computes on at step t+1.
          CHECK(s.step(s.prev(r), t).origin == s.step(r, t + 1).origin);
          // A receive never overwrites the block being computed on beside it,
          // and waits for the compute of step t-1 exactly when that one reads
          // the buffer it overwrites.
          CHECK(st.recv_into != st.compute_from);
          CHECK(st.recv_waits_for_previous_compute ==
                (t > 0 && s.step(r, t - 1).compute_from == st.recv_into));
        }
        std::sort(seen.begin(), seen.end());
        for (int o = 0; o < P; ++o) CHECK(seen[static_cast<size_t>(o)] == o);  // each block once
      }
    }
  }
}

TEST_CASE("ring simulation matches the fp64 reference on ragged lengths, P = 1, 2, 3, 4, 8") {
  // Partials from the fp64 reference, merged by partial_merge.h in the
  // schedule's order: every length, rank count and assignment, causal and
  // not, with the ragged grid's head dimensions.
  const std::int64_t dims[] = {1, 40, 59, 111};
  std::uint64_t seed = 16000;
  int k = 0;
  for (std::int64_t N : kLengths) {
    for (int P : kRanks) {
      for (Assign a : kAssigns) {
        for (bool causal : {false, true}) {
          const Problem p = ring_problem(2, 1, N, dims[k++ % 4], causal);
          const Schedule s(N, P, a, causal);
          CAPTURE(describe(p, s));
          const auto in = flashstep::random_inputs(p, seed++);
          const auto sim =
              flashstep::ring::simulate(p, in, s, flashstep::ring::reference_partial());
          const auto c = check_simulation(p, in, sim);
          CHECK_MESSAGE(c.ok(), c.summary());
        }
      }
    }
  }
}

TEST_CASE("ring simulation at N = 1023 on 8 ranks and with scales of every sign") {
  std::uint64_t seed = 16500;
  for (Assign a : kAssigns) {
    for (bool causal : {false, true}) {
      const Problem p = ring_problem(1, 2, 1023, 64, causal);
      const Schedule s(p.Nq, 8, a, causal);
      CAPTURE(describe(p, s));
      const auto in = flashstep::random_inputs(p, seed++);
      const auto sim = flashstep::ring::simulate(p, in, s, flashstep::ring::reference_partial());
      const auto c = check_simulation(p, in, sim);
      CHECK_MESSAGE(c.ok(), c.summary());
    }
  }
  for (double scale : {-0.5, 0.0, 1.0}) {
    Problem p = ring_problem(1, 2, 97, 64, true);
    p.scale = scale;
    const Schedule s(p.Nq, 3, Assign::kZigzag, true);
    CAPTURE(describe(p, s));
    const auto in = flashstep::random_inputs(p, seed++);
    const auto sim = flashstep::ring::simulate(p, in, s, flashstep::ring::reference_partial());
    const auto c = check_simulation(p, in, sim);
    CHECK_MESSAGE(c.ok(), c.summary());
  }
}

TEST_CASE("ring simulation with the stages' mirrors: 04 in fp32, 07 in bf16 and fp16") {
  // Each partial as the GPU's kernel computes it, in its numerics: the merge
  // takes 07's partials rounded to 16 bits and rounds the merged O once more,
  // and still meets FlashAttention's bound (twice naive attention's error).
  // The counts: the model of every rank, against what the simulation counted.
  struct Case {
    const char* stage;
    DType t;
  };
  std::uint64_t seed = 17000;
  for (const Case& cs : {Case{"04_fa2_q_outer", DType::kFp32}, Case{"07_tensor_core", DType::kBf16},
                         Case{"07_tensor_core", DType::kFp16}}) {
    const flashstep::Stage& stage = stage_named(cs.stage);
    for (const auto& [N, d, P] : {std::tuple<std::int64_t, std::int64_t, int>{203, 59, 3},
                                  {113, 128, 2}, {1023, 64, 4}, {17, 40, 8}}) {
      for (Assign a : kAssigns) {
        for (bool causal : {false, true}) {
          const Problem p = ring_problem(1, 2, N, d, causal, cs.t);
          const Schedule s(N, P, a, causal);
          CAPTURE(cs.stage);
          CAPTURE(describe(p, s));
          const auto in = flashstep::random_inputs(p, seed++);
          const auto sim =
              flashstep::ring::simulate(p, in, s, flashstep::ring::mirror_partial(stage));
          const auto c = check_simulation(p, in, sim);
          CHECK_MESSAGE(c.ok(), c.summary());
          const auto model = flashstep::ring::ring_cost(p, s, stage);
          for (int r = 0; r < P; ++r) {
            CAPTURE(r);
            flashstep::test::check_counts_equal(sim.counted[static_cast<size_t>(r)].compute,
                                                model[static_cast<size_t>(r)].compute);
          }
        }
      }
    }
  }
}

TEST_CASE("ring model: bytes sent and received, scores and pairs equal the simulation's counts") {
  // The model's closed forms (ring_model.h) against what the simulation
  // copied between ranks and computed, on every length, rank count and
  // assignment, in fp32 and bf16 (2-byte elements).
  const flashstep::Stage& stage = stage_named("05_sequence_parallel");
  for (std::int64_t N : kLengths) {
    for (int P : kRanks) {
      for (Assign a : kAssigns) {
        for (bool causal : {false, true}) {
          for (DType t : {DType::kFp32, DType::kBf16}) {
            const Problem p = ring_problem(2, 3, N, 5, causal, t);
            const Schedule s(N, P, a, causal);
            CAPTURE(describe(p, s));
            const auto in = flashstep::random_inputs(p, 1);
            const auto sim =
                flashstep::ring::simulate(p, in, s, flashstep::ring::reference_partial());
            const auto model = flashstep::ring::ring_cost(p, s, stage);
            std::int64_t scores = 0;
            for (int r = 0; r < P; ++r) {
              CAPTURE(r);
              const auto& got = sim.counted[static_cast<size_t>(r)];
              const auto& want = model[static_cast<size_t>(r)];
              CHECK(got.bytes_sent == want.bytes_sent);
              CHECK(got.bytes_received == want.bytes_received);
              CHECK(got.scores == want.scores);
              CHECK(got.scores == s.rank_scores(r));
              CHECK(got.full == want.full);
              CHECK(got.diagonal == want.diagonal);
              CHECK(got.skipped == want.skipped);
              scores += got.scores;
            }
            CHECK(scores == (causal ? N * (N + 1) / 2 : N * N));  // every visible score, once
            if (N % P == 0 && a == Assign::kContiguous) {
              // Divisible: 2 (P-1)/P B H N d E each way, from every rank.
              const std::int64_t each = 2 * (P - 1) * p.heads() * (N / P) * p.d * p.elem_bytes();
              for (const auto& m : model) CHECK(m.bytes_sent == each);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring load balance: causal contiguous chunks leave the last rank most of the work, zig-zag none") {
  // N = 2 P m tokens. Contiguous, chunk n = 2m: rank r computes r full
  // pairs and one diagonal; each step lasts as long as the last rank's full
  // pair, so the critical path is (2P-1)/P of the balanced ideal when m is
  // large. Zig-zag: every rank has 2 full pairs of m x m per step (step 0:
  // one full, two diagonal), so the critical path is the ideal exactly.
  const std::int64_t m = 4096;
  for (int P : {2, 4, 8}) {
    const std::int64_t N = 2 * P * m;
    const Schedule contiguous(N, P, Assign::kContiguous, true);
    const Schedule zigzag(N, P, Assign::kZigzag, true);
    const std::int64_t total = N * (N + 1) / 2;
    std::int64_t sum = 0;
    for (int r = 0; r < P; ++r) sum += contiguous.rank_scores(r);
    REQUIRE(sum == total);
    const double ideal = static_cast<double>(total) / P;
    const double c_ratio = static_cast<double>(contiguous.critical_path_scores()) / ideal;
    const double z_ratio = static_cast<double>(zigzag.critical_path_scores()) / ideal;
    const double busiest =
        static_cast<double>(contiguous.rank_scores(P - 1)) / static_cast<double>(contiguous.rank_scores(0));
    MESSAGE("P = " << P << ", N = " << N << ": critical path / ideal: contiguous " << c_ratio
                   << ", zig-zag " << z_ratio << "; contiguous last rank's work / first's "
                   << busiest);
    const std::int64_t n = 2 * m;
    CHECK(contiguous.critical_path_scores() == n * (n + 1) / 2 + (P - 1) * n * n);
    CHECK(c_ratio == doctest::Approx((2.0 * P - 1) / P).epsilon(1e-3));
    CHECK(zigzag.critical_path_scores() * P == total);
    for (int r = 0; r < P; ++r) {
      CHECK(zigzag.rank_scores(r) == total / P);
      for (int t = 1; t < P; ++t) CHECK(zigzag.scores(r, t) == 2 * m * m);
    }
    CHECK(busiest == doctest::Approx(2.0 * P - 1).epsilon(1e-3));
  }
}

TEST_CASE("ring simulation: a receive that skips its wait overwrites a block before it is computed on") {
  // With P >= 4 the third transfer reuses the first receive buffer; run it
  // before step 1's compute (as a GPU would if the communication stream did
  // not wait) and step 1 attends to the wrong keys. With P = 2 and 3 there
  // are too few transfers for that, and the result stays right.
  for (int P : {2, 3, 4, 8}) {
    const Problem p = ring_problem(1, 2, 203, 40, false);
    const Schedule s(p.Nq, P, Assign::kContiguous, false);
    CAPTURE(P);
    const auto in = flashstep::random_inputs(p, 5);
    const auto sim = flashstep::ring::simulate(p, in, s, flashstep::ring::reference_partial(),
                                               flashstep::ring::Waits::kIgnore);
    CHECK(check_simulation(p, in, sim).ok() == (P < 4));
  }
}

TEST_CASE("ring rules: Nq = Nk, a stage that writes L, and an unknown assignment") {
  CHECK_THROWS_WITH_AS(flashstep::ring::validate_ring(make_problem(1, 1, 10, 12, 8, false)),
                       doctest::Contains("needs Nq = Nk"), flashstep::Error);
  CHECK_NOTHROW(flashstep::ring::validate_ring(make_problem(1, 1, 12, 12, 8, true)));
  const Problem p = ring_problem(1, 1, 64, 8, false);
  CHECK_THROWS_WITH_AS(flashstep::ring::require_partial_stage(stage_named("01_naive"), p),
                       doctest::Contains("does not write L"), flashstep::Error);
  CHECK_THROWS_WITH_AS(flashstep::ring::require_partial_stage(stage_named("07_tensor_core"), p),
                       doctest::Contains("does not run in fp32"), flashstep::Error);
  CHECK_THROWS_WITH_AS(flashstep::ring::parse_assign("spiral"),
                       doctest::Contains("contiguous or zigzag"), flashstep::Error);
  CHECK_THROWS_AS(Schedule(0, 2, Assign::kZigzag, true), flashstep::Error);
  CHECK_THROWS_AS(Schedule(10, 0, Assign::kZigzag, true), flashstep::Error);
  const flashstep::Inputs in = flashstep::random_inputs(p, 1);
  CHECK_THROWS_WITH_AS(flashstep::ring::simulate(p, in, Schedule(65, 2, Assign::kZigzag, false),
                                                 flashstep::ring::reference_partial()),
                       doctest::Contains("N = 65"), flashstep::Error);
}

TEST_CASE("flashstep_ring arguments: defaults, every flag, and one clear error each") {
  using flashstep::ring::parse_ring_args;
  const auto o = parse_ring_args({});
  CHECK(o.mode == flashstep::ring::Mode::kRun);
  CHECK(o.stage == "07_tensor_core");
  CHECK(o.assign == Assign::kZigzag);
  CHECK(o.gpus == 0);
  CHECK(o.problem.Nq == o.problem.Nk);
  const auto m = parse_ring_args({"model", "--N", "1000", "--causal", "--assign", "contiguous",
                                  "--stage", "05", "--B", "2", "--H", "3", "--d", "40",
                                  "--no-overlap", "--iters", "0", "--format", "csv"});
  CHECK(m.mode == flashstep::ring::Mode::kModel);
  CHECK(m.gpus == flashstep::ring::kModelDefaultGpus);
  CHECK(m.problem.Nq == 1000);
  CHECK(m.problem.causal);
  CHECK(m.assign == Assign::kContiguous);
  CHECK(!m.overlap);
  CHECK(m.iterations == 0);
  CHECK(m.format == flashstep::cli::Format::kCsv);
  CHECK(parse_ring_args({"--gpus", "3", "--dtype", "fp16"}).gpus == 3);
  CHECK(parse_ring_args({"--help"}).mode == flashstep::ring::Mode::kHelp);
  struct Bad {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Bad& bad : std::vector<Bad>{
           {{"--assign", "spiral"}, "--assign must be contiguous or zigzag"},
           {{"--gpus", "0"}, "--gpus must be in 1..1024"},
           {{"--gpus", "two"}, "--gpus expects an integer"},
           {{"--N", "0"}, "Nq must be >= 1"},
           {{"--stage", "07"}, "name one"},
           {{"--stage", "01"}, "does not write L"},
           {{"--stage", "05", "--dtype", "bf16"}, "does not run in bf16"},
           {{"--stage", "99"}, "unknown stage"},
           {{"--causal=yes"}, "--causal takes no value"},
           {{"--N"}, "--N expects a value"},
           {{"--frobnicate"}, "unknown argument '--frobnicate'"},
           {{"--format", "xml"}, "--format must be table, csv or json"},
       }) {
    CAPTURE(bad.args.front());
    CHECK_THROWS_WITH_AS(parse_ring_args(bad.args), doctest::Contains(bad.says), flashstep::Error);
  }
  CHECK(flashstep::ring::ring_usage().find("--assign") != std::string::npos);
}

TEST_CASE("flashstep_ring model: a row per rank and the stage alone, in every format") {
  const auto o = flashstep::ring::parse_ring_args({"model", "--N", "4096", "--causal", "--gpus",
                                                   "4", "--assign", "contiguous"});
  const flashstep::Stage& stage = flashstep::ring::partial_stage(o);
  const Problem p = flashstep::ring::typed_problem(o, stage);
  CHECK(p.dtype == DType::kBf16);  // 07's native type
  const Schedule s(p.Nq, o.gpus, o.assign, p.causal);
  const auto r = flashstep::ring::model_report(p, s, stage);
  CHECK(r.rows.size() == 5);  // 4 ranks, then one GPU alone
  CHECK(r.title.find("critical path 1.75x") != std::string::npos);
  for (auto f : {flashstep::cli::Format::kTable, flashstep::cli::Format::kCsv,
                 flashstep::cli::Format::kJson}) {
    std::ostringstream out;
    flashstep::cli::print(r, f, out);
    CHECK(out.str().find("1 GPU") != std::string::npos);
  }
  // The numbers: 4096 tokens in 4 chunks of 1024; rank 3 computes 3 full
  // pairs and its diagonal and sends every block but rank 0's.
  CHECK(r.rows[3][3].raw == "3");
  CHECK(r.rows[3][4].raw == "1");
  CHECK(r.rows[3][6].raw == std::to_string(3 * 1024 * 1024 + 1024 * 1025 / 2));
  CHECK(r.rows[3][8].raw == std::to_string(2 * 8 * 128 * 2 * 3 * 1024));
}

TEST_CASE("ring fp64 check: every row of a small problem, two rows of each chunk at least of a huge one") {
  const Schedule small(512, 2, Assign::kZigzag, true);
  CHECK(flashstep::ring::check_row_step(ring_problem(1, 8, 512, 64, true), small) == 1);
  const std::int64_t N = 1 << 21;
  const Problem huge = ring_problem(1, 8, N, 128, true);
  for (Assign a : kAssigns) {
    const Schedule s(N, 2, a, true);
    const std::int64_t step = flashstep::ring::check_row_step(huge, s);
    CAPTURE(assign_name(a));
    CHECK(step > 1);
    for (int c = 0; c < s.chunk_count(); ++c) {
      const Chunk ch = s.chunk(c);
      const std::int64_t first = (ch.begin + step - 1) / step * step;  // first checked row
      CHECK(first + step < ch.end);  // and a second one
    }
  }
}
