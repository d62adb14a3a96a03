// Ring attention's schedule (ring_schedule.h): host code shared by the CPU
// simulation and the GPU runner.
#include "ring_schedule.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace flashstep::ring {

std::string_view assign_name(Assign a) {
  return a == Assign::kZigzag ? "zigzag" : "contiguous";
}

Assign parse_assign(std::string_view name) {
  if (name == "contiguous") return Assign::kContiguous;
  if (name == "zigzag") return Assign::kZigzag;
  throw Error("--assign must be contiguous or zigzag, got '" + std::string(name) + "'");
}

Schedule::Schedule(std::int64_t N, int P, Assign assign, bool causal)
    : N_(N), P_(P), assign_(assign), causal_(causal) {
  if (N < 1) throw Error("ring: the sequence needs N >= 1 tokens, got " + std::to_string(N));
  if (P < 1) throw Error("ring: needs P >= 1 ranks, got " + std::to_string(P));
}

int Schedule::chunk_count() const { return slots() * P_; }

Chunk Schedule::chunk(int c) const {
  const std::int64_t C = chunk_count();
  return {N_ * c / C, N_ * (c + 1) / C};
}

std::vector<int> Schedule::held(int rank) const {
  if (assign_ == Assign::kContiguous) return {rank};
  return {rank, 2 * P_ - 1 - rank};  // one chunk from the front, its mirror from the back
}

std::int64_t Schedule::rows_held(int rank) const {
  std::int64_t rows = 0;
  for (int c : held(rank)) rows += chunk(c).size();
  return rows;
}

std::int64_t Schedule::max_chunk_rows() const {
  // Chunk sizes are floor(N / C) or one more, the larger ones last.
  return chunk(chunk_count() - 1).size();
}

int Schedule::origin(int rank, int t) const { return (rank - t % P_ + P_) % P_; }

PairKind Schedule::kind(int q_chunk, int kv_chunk) const {
  if (chunk(q_chunk).size() == 0 || chunk(kv_chunk).size() == 0) return PairKind::kSkip;
  if (!causal_ || q_chunk > kv_chunk) return PairKind::kFull;
  return q_chunk == kv_chunk ? PairKind::kDiagonal : PairKind::kSkip;
}

namespace {
// The receive buffer step t fills: the two alternate, so the block computed at
// step t (received at step t-1) is never the one being overwritten.
Buffer recv_buffer(int t) { return t % 2 == 0 ? Buffer::kRecv0 : Buffer::kRecv1; }
}  // namespace

Step Schedule::step(int rank, int t) const {
  Step s;
  s.t = t;
  s.origin = origin(rank, t);
  // Step 0 computes on the rank's own block; step t > 0 on the one step t-1 received.
  s.compute_from = t == 0 ? Buffer::kOwn : recv_buffer(t - 1);
  s.transfers = t < P_ - 1;
  s.recv_into = recv_buffer(t);
  const Buffer previous_compute = t <= 1 ? Buffer::kOwn : recv_buffer(t - 2);
  s.recv_waits_for_previous_compute = t >= 1 && previous_compute == s.recv_into;
  const std::vector<int> q = held(rank), kv = held(s.origin);
  for (int qs = 0; qs < static_cast<int>(q.size()); ++qs) {
    for (int ks = 0; ks < static_cast<int>(kv.size()); ++ks) {
      s.pairs.push_back({q[qs], qs, kv[ks], ks, kind(q[qs], kv[ks])});
    }
  }
  return s;
}

std::int64_t Schedule::scores(int rank, int t) const {
  std::int64_t total = 0;
  for (const Pair& pr : step(rank, t).pairs) {
    const std::int64_t nq = chunk(pr.q_chunk).size(), nk = chunk(pr.kv_chunk).size();
    if (pr.kind == PairKind::kFull) total += nq * nk;
    if (pr.kind == PairKind::kDiagonal) total += nq * (nq + 1) / 2;
  }
  return total;
}

std::int64_t Schedule::rank_scores(int rank) const {
  std::int64_t total = 0;
  for (int t = 0; t < P_; ++t) total += scores(rank, t);
  return total;
}

std::int64_t Schedule::critical_path_scores() const {
  std::int64_t total = 0;
  for (int t = 0; t < P_; ++t) {
    std::int64_t busiest = 0;
    for (int r = 0; r < P_; ++r) busiest = std::max(busiest, scores(r, t));
    total += busiest;
  }
  return total;
}

namespace {
// n rounded up to a whole number of kAlignElems, at least one.
std::int64_t aligned(std::int64_t n) {
  const std::int64_t a = Layout::kAlignElems;
  return std::max<std::int64_t>((n + a - 1) / a * a, a);
}
}  // namespace

Layout layout(const Schedule& s, std::int64_t heads, std::int64_t d) {
  Layout l;
  l.capacity = aligned(heads * s.max_chunk_rows() * d);
  l.lse_capacity = aligned(heads * s.max_chunk_rows());
  l.slots = s.slots();
  return l;
}

void gather_rows(const float* src, std::int64_t heads, std::int64_t N, std::int64_t cols, Chunk c,
                 float* dst) {
  for (std::int64_t h = 0; h < heads; ++h) {
    std::copy(src + (h * N + c.begin) * cols, src + (h * N + c.end) * cols,
              dst + h * c.size() * cols);
  }
}

void scatter_rows(const float* src, std::int64_t heads, std::int64_t N, std::int64_t cols, Chunk c,
                  float* dst) {
  for (std::int64_t h = 0; h < heads; ++h) {
    std::copy(src + h * c.size() * cols, src + (h + 1) * c.size() * cols,
              dst + (h * N + c.begin) * cols);
  }
}

}  // namespace flashstep::ring
