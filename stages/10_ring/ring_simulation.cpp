// Ring attention on the CPU (ring_simulation.h).
#include "ring_simulation.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/partial_merge.h"
#include "common/reference.h"
#include "common/rounding.h"

namespace flashstep::ring {

namespace {

constexpr float kNoKey = -std::numeric_limits<float>::infinity();

// What one rank holds, as a GPU holds it (ring_schedule.h's Layout).
struct Rank {
  std::vector<float> Q;                  // slot s at array(s): [B, H, n_s, d], p.dtype's values
  std::array<std::vector<float>, 3> kv;  // Buffer kOwn, kRecv0, kRecv1: K, V chunks of a block
  std::vector<float> O_acc;              // slot s at array(s): [B, H, n_s, d], fp32
  std::vector<float> L_acc;              // slot s at lse(s): [B, H, n_s]
  std::vector<float> O_part;             // [B, H, n_q, d] of the pair being merged
  std::vector<float> L_part;             // [B, H, n_q]
  RankCost counted;
};

std::vector<float>& buffer(Rank& r, Buffer b) { return r.kv[static_cast<size_t>(b)]; }

// Visible (query, key) pairs of Q chunk q against K/V chunk k under the
// global mask, query by query: what the pair's partial must compute.
std::int64_t visible_scores(const Problem& p, Chunk q, Chunk k) {
  std::int64_t n = 0;
  for (std::int64_t i = q.begin; i < q.end; ++i) {
    n += std::clamp<std::int64_t>(p.visible_keys(i) - k.begin, 0, k.size());
  }
  return n;
}

// Transfer t of every rank at once: the block rank r computes on at step t
// goes from that buffer into the buffer rank r+1 receives into.
void transfer(const Problem& p, const Schedule& s, const Layout& lay, std::vector<Rank>& ranks,
              int t) {
  for (int r = 0; r < s.ranks(); ++r) {
    const Step from = s.step(r, t);
    const int to = s.next(r);
    const std::vector<float>& src = buffer(ranks[static_cast<size_t>(r)], from.compute_from);
    std::vector<float>& dst = buffer(ranks[static_cast<size_t>(to)], s.step(to, t).recv_into);
    const std::vector<int> chunks = s.held(from.origin);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      const std::int64_t n = p.heads() * s.chunk(chunks[static_cast<size_t>(slot)]).size() * p.d;
      for (std::int64_t offset : {lay.K(slot), lay.V(slot)}) {
        std::copy(src.begin() + offset, src.begin() + offset + n, dst.begin() + offset);
        ranks[static_cast<size_t>(r)].counted.bytes_sent += n * p.elem_bytes();
        ranks[static_cast<size_t>(to)].counted.bytes_received += n * p.elem_bytes();
      }
    }
  }
}

// Step t of rank r: each pair's partial from the block in its buffer, merged
// into the Q chunk's accumulator, in the schedule's order.
void compute(const Problem& p, const Schedule& s, const Layout& lay, Rank& rank, int r, int t,
             const PartialFn& partial) {
  const Step st = s.step(r, t);
  const std::vector<float>& kv = buffer(rank, st.compute_from);
  for (const Pair& pair : st.pairs) {
    if (pair.kind == PairKind::kSkip) {
      ++rank.counted.skipped;
      continue;
    }
    ++(pair.kind == PairKind::kFull ? rank.counted.full : rank.counted.diagonal);
    const Problem sub = pair_problem(p, s, pair);
    rank.counted.scores +=
        visible_scores(p, s.chunk(pair.q_chunk), s.chunk(pair.kv_chunk));
    std::fill(rank.O_part.begin(), rank.O_part.end(), NAN);  // every element must be written
    std::fill(rank.L_part.begin(), rank.L_part.end(), NAN);
    HostTensors t_pair;
    t_pair.Q = rank.Q.data() + lay.array(pair.q_slot);
    t_pair.K = kv.data() + lay.K(pair.kv_slot);
    t_pair.V = kv.data() + lay.V(pair.kv_slot);
    t_pair.O = rank.O_part.data();
    t_pair.L = rank.L_part.data();
    rank.counted.compute += partial(sub, t_pair);
    float* O_acc = rank.O_acc.data() + lay.array(pair.q_slot);  // [B, H, n_q, d]
    float* L_acc = rank.L_acc.data() + lay.lse(pair.q_slot);    // [B, H, n_q]
    for (std::int64_t row = 0; row < sub.lse_elems(); ++row) {
      merge_into(O_acc + row * p.d, L_acc[row], rank.O_part.data() + row * p.d,
                 rank.L_part[static_cast<size_t>(row)], static_cast<int>(p.d));
    }
    rank.counted.compute += merge_cost(p, sub.Nq);
  }
}

}  // namespace

PartialFn reference_partial() {
  return [](const Problem& sub, const HostTensors& t) {
    const ReferenceResult ref = reference_forward(sub, t.Q, t.K, t.V);
    for (size_t k = 0; k < ref.O.size(); ++k) {
      t.O[k] = round_to_dtype(sub.dtype, static_cast<float>(ref.O[k]));
    }
    for (size_t k = 0; k < ref.L.size(); ++k) t.L[k] = static_cast<float>(ref.L[k]);
    return Cost{};
  };
}

PartialFn mirror_partial(const Stage& stage) {
  if (!stage.mirror) throw Error("stage " + std::string(stage.name) + " has no CPU mirror");
  const MirrorFn mirror = stage.mirror;
  return [mirror](const Problem& sub, const HostTensors& t) { return mirror(sub, t); };
}

Simulation simulate(const Problem& p, const Inputs& in, const Schedule& s,
                    const PartialFn& partial, Waits waits) {
  validate_ring(p);
  if (s.tokens() != p.Nq) {
    throw Error("ring simulation: the schedule is for N = " + std::to_string(s.tokens()) +
                ", the problem has N = " + std::to_string(p.Nq));
  }
  const Layout lay = layout(s, p.heads(), p.d);
  const std::int64_t N = p.Nq;

  // Each rank's share of the inputs, rounded to the type as the runner sends it.
  std::vector<Rank> ranks(static_cast<size_t>(s.ranks()));
  for (int r = 0; r < s.ranks(); ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    rank.Q.assign(static_cast<size_t>(lay.chunk_elems()), NAN);
    for (std::vector<float>& kv : rank.kv) kv.assign(static_cast<size_t>(lay.kv_elems()), NAN);
    rank.O_acc.assign(static_cast<size_t>(lay.chunk_elems()), 0.0f);
    rank.L_acc.assign(static_cast<size_t>(lay.lse_elems()), kNoKey);
    rank.O_part.resize(static_cast<size_t>(lay.capacity));
    rank.L_part.resize(static_cast<size_t>(lay.lse_capacity));
    const std::vector<int> chunks = s.held(r);
    std::vector<float>& own = buffer(rank, Buffer::kOwn);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      const Chunk c = s.chunk(chunks[static_cast<size_t>(slot)]);
      const std::int64_t n = p.heads() * c.size() * p.d;
      struct Part {
        const float* src;
        float* dst;
      };
      for (Part part : {Part{in.Q.data(), rank.Q.data() + lay.array(slot)},
                        Part{in.K.data(), own.data() + lay.K(slot)},
                        Part{in.V.data(), own.data() + lay.V(slot)}}) {
        gather_rows(part.src, p.heads(), N, p.d, c, part.dst);
        round_to_dtype(p.dtype, part.dst, n);
      }
    }
  }

  // The steps, every transfer as early as its dependencies allow.
  int transfers_done = 0;
  for (int t = 0; t < s.ranks(); ++t) {
    while (transfers_done < s.ranks() - 1) {
      const Step next = s.step(0, transfers_done);  // the same flags on every rank
      const bool blocked = waits == Waits::kHonour && next.recv_waits_for_previous_compute &&
                           transfers_done - 1 >= t;  // compute transfers_done-1 not run yet
      if (blocked) break;
      transfer(p, s, lay, ranks, transfers_done++);
    }
    for (int r = 0; r < s.ranks(); ++r) {
      compute(p, s, lay, ranks[static_cast<size_t>(r)], r, t, partial);
    }
  }

  // The accumulators are the output: O rounded to the type, L as it is.
  Simulation out;
  out.O.assign(static_cast<size_t>(p.q_elems()), NAN);
  out.L.assign(static_cast<size_t>(p.lse_elems()), NAN);
  for (int r = 0; r < s.ranks(); ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    const std::vector<int> chunks = s.held(r);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      const Chunk c = s.chunk(chunks[static_cast<size_t>(slot)]);
      if (c.size() == 0) continue;
      float* O_acc = rank.O_acc.data() + lay.array(slot);
      round_to_dtype(p.dtype, O_acc, p.heads() * c.size() * p.d);
      scatter_rows(O_acc, p.heads(), N, p.d, c, out.O.data());
      scatter_rows(rank.L_acc.data() + lay.lse(slot), p.heads(), N, 1, c, out.L.data());
      rank.counted.compute += init_finish_cost(p, c.size());
    }
    out.counted.push_back(rank.counted);
  }
  return out;
}

}  // namespace flashstep::ring
