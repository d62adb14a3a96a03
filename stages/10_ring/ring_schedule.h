/// \file ring_schedule.h
/// \brief Ring attention's schedule: which chunks of the sequence each GPU
/// (rank) holds, whose K/V block it has at each step, which (Q chunk, K/V
/// chunk) partials it computes in full, computes causally or skips, the order
/// it merges them in, and which of its K/V buffers each step reads, sends and
/// fills.
///
/// One piece of host code that both the CPU simulation (ring_simulation.h)
/// and the GPU runner (ring_runner.h) follow, so the simulation, which CI
/// checks against the fp64 reference, proves what the GPUs run.
///
/// The sequence of N tokens is cut into C chunks, the same chunks for Q and
/// for K/V. With the bottom-right causal mask and Nq = Nk, query i sees key j
/// iff j <= i, so a pair (Q chunk a, K/V chunk b) is
///
///     a > b   every key of b precedes every query of a: fully visible,
///             the stage runs non-causal
///     a == b  the chunk against itself: n_q = n_k, and the stage's own
///             bottom-right mask (j <= i + n_k - n_q = i) is the global one
///     a < b   every key of b follows every query of a: fully masked, skipped
///
/// whatever the chunks' sizes, so any forward stage that writes L computes
/// each partial unchanged. Contiguous assignment gives rank r chunk r of
/// C = P; zig-zag gives it chunks r and 2P-1-r of C = 2P, one early and one
/// late, which balances the causal work (see scores()).
///
/// The ring, P ranks, each sending to the next:
///
///        rank 0 ──► rank 1 ──► rank 2 ──► ... ──► rank P-1
///          ▲                                         │
///          └─────────────────────────────────────────┘
///
/// At step t (0 <= t < P) rank r computes on the K/V block of rank
/// (r - t) mod P while, for t < P-1, it sends that block on to rank r+1 and
/// receives the next one from rank r-1.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace flashstep::ring {

/// How the sequence's chunks are dealt to the ranks.
enum class Assign {
  kContiguous,  ///< C = P chunks; rank r holds chunk r
  kZigzag,      ///< C = 2P chunks; rank r holds chunks r and 2P-1-r (striped, load-balanced)
};

/// "contiguous" or "zigzag".
std::string_view assign_name(Assign a);

/// The assignment a name gives; throws flashstep::Error naming the two for
/// anything else.
Assign parse_assign(std::string_view name);

/// Rows [begin, end) of the sequence.
struct Chunk {
  std::int64_t begin = 0;  ///< first row
  std::int64_t end = 0;    ///< one past the last row
  std::int64_t size() const { return end - begin; }  ///< rows in the chunk (may be 0)
};

/// How a (Q chunk, K/V chunk) partial is computed.
enum class PairKind {
  kSkip,      ///< fully masked (causal, Q chunk before K/V chunk) or an empty chunk
  kFull,      ///< every key visible to every query: the stage, non-causal
  kDiagonal,  ///< causal, a chunk against itself: the stage, causal
};

/// One partial of a step: Q chunk `q_chunk` (the rank's slot `q_slot`, which
/// is also its accumulator) against K/V chunk `kv_chunk` (slot `kv_slot` of
/// the block that passes).
struct Pair {
  int q_chunk = 0;   ///< chunk index in the sequence
  int q_slot = 0;    ///< its position among the rank's chunks
  int kv_chunk = 0;  ///< chunk index in the sequence
  int kv_slot = 0;   ///< its position in the K/V block
  PairKind kind = PairKind::kSkip;
};

/// One of a rank's three K/V buffers: its own block (never overwritten), and
/// two it receives into in turn.
enum class Buffer { kOwn, kRecv0, kRecv1 };

/// What one rank does at one step.
struct Step {
  int t = 0;       ///< the step, 0 .. P-1
  int origin = 0;  ///< the rank whose K/V block this rank computes on
  Buffer compute_from = Buffer::kOwn;  ///< where that block is (and what is sent on)
  bool transfers = false;  ///< whether a send and receive run beside the compute (t < P-1)
  Buffer recv_into = Buffer::kRecv0;  ///< where the next block arrives (when transfers)
  /// Whether the receive must wait for this rank's compute of step t-1: it
  /// reads the buffer the receive overwrites. The GPU makes the communication
  /// stream wait on that compute; the simulation runs each receive as early
  /// as this allows.
  bool recv_waits_for_previous_compute = false;
  std::vector<Pair> pairs;  ///< every (Q slot, K/V slot) pair, in merge order
};

/// The schedule of ring attention over P ranks for a sequence of N tokens.
class Schedule {
 public:
  /// Throws flashstep::Error when N < 1 or P < 1.
  Schedule(std::int64_t N, int P, Assign assign, bool causal);

  int ranks() const { return P_; }            ///< P
  int chunk_count() const;                    ///< C: P contiguous, 2P zig-zag
  std::int64_t tokens() const { return N_; }  ///< N
  Assign assign() const { return assign_; }   ///< how the chunks are dealt
  bool causal() const { return causal_; }     ///< whether the mask is causal

  /// Chunk c: rows [N c / C, N (c+1) / C), so sizes differ by at most one
  /// (the smaller first) and any N works, including N < C (empty chunks).
  Chunk chunk(int c) const;
  /// The chunks rank r holds, in slot order.
  std::vector<int> held(int rank) const;
  /// Rows rank r holds: the sum of its chunks' sizes.
  std::int64_t rows_held(int rank) const;
  /// The largest chunk: what every chunk-sized buffer must hold.
  std::int64_t max_chunk_rows() const;
  /// Chunks per rank: 1 contiguous, 2 zig-zag.
  int slots() const { return assign_ == Assign::kZigzag ? 2 : 1; }

  int next(int rank) const { return (rank + 1) % P_; }       ///< where rank sends
  int prev(int rank) const { return (rank + P_ - 1) % P_; }  ///< where rank receives from
  /// The rank whose K/V block rank `rank` computes on at step t: (rank - t) mod P.
  int origin(int rank, int t) const;

  /// How Q chunk a meets K/V chunk b (the comment at the top of this file).
  PairKind kind(int q_chunk, int kv_chunk) const;

  /// Rank r's step t.
  Step step(int rank, int t) const;

  /// Scores (query, key) pairs rank r computes at step t: n_q n_k for a
  /// full pair, n (n+1) / 2 for a diagonal one, summed over its pairs.
  std::int64_t scores(int rank, int t) const;
  /// scores() summed over the steps of rank r.
  std::int64_t rank_scores(int rank) const;
  /// The ring's critical path in scores: each step lasts as long as its
  /// busiest rank (every rank waits for the block its neighbour sends), so
  /// the sum over steps of the largest scores(r, t). The ideal is the total
  /// over P; contiguous causal assignment is far from it, zig-zag close.
  std::int64_t critical_path_scores() const;

 private:
  std::int64_t N_;
  int P_;
  Assign assign_;
  bool causal_;
};

/// Where a rank keeps its chunks in memory, the same on the GPU (in elements
/// of the problem's type) and in the simulation (in floats). Every
/// chunk-sized array [B, H, n, d] has room for the largest chunk, rounded up
/// to kAlignElems elements so that each starts 256-byte aligned in any type
/// (the stages' vector loads need 16): its Q chunks and accumulators are
/// arrays 0 .. slots-1, and a K/V buffer holds the K chunks of a block in
/// arrays 0 .. slots-1 and the V chunks in arrays slots .. 2 slots-1. A block
/// travels as its chunks' B H n d elements alone, not the padding.
struct Layout {
  static constexpr std::int64_t kAlignElems = 128;  ///< 256 bytes in 16-bit types, 512 in fp32
  std::int64_t capacity = 0;  ///< elements per array: B H max_chunk_rows d, rounded up
  std::int64_t lse_capacity = 0;  ///< elements per L array [B, H, n]: B H max_chunk_rows, rounded up
  int slots = 1;              ///< chunks per rank
  std::int64_t array(int a) const { return a * capacity; }          ///< offset of array a
  std::int64_t K(int slot) const { return array(slot); }            ///< K chunk of a block's slot
  std::int64_t V(int slot) const { return array(slots + slot); }    ///< V chunk of a block's slot
  std::int64_t chunk_elems() const { return slots * capacity; }     ///< Q, O: one array per slot
  std::int64_t kv_elems() const { return 2 * slots * capacity; }    ///< one K/V buffer
  std::int64_t lse(int slot) const { return slot * lse_capacity; }  ///< L accumulator of a slot
  std::int64_t lse_elems() const { return slots * lse_capacity; }   ///< every slot's L
};

/// The layout for `heads` = B H heads of head dimension d.
Layout layout(const Schedule& s, std::int64_t heads, std::int64_t d);

/// Copies rows [c.begin, c.end) of every head of src [heads, N, cols] to
/// dst [heads, c.size(), cols]: a chunk out of the whole sequence.
void gather_rows(const float* src, std::int64_t heads, std::int64_t N, std::int64_t cols, Chunk c,
                 float* dst);

/// The reverse: src [heads, c.size(), cols] into rows [c.begin, c.end) of
/// every head of dst [heads, N, cols].
void scatter_rows(const float* src, std::int64_t heads, std::int64_t N, std::int64_t cols, Chunk c,
                  float* dst);

}  // namespace flashstep::ring
