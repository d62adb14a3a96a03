// Stage 09's KV cache in the tests (test_split_kv.cpp on the CPU,
// test_kvcache_gpu.cpp on the GPU): a paged cache built from a contiguous
// one, the new tokens appended to a contiguous copy, and each sequence's
// output checked against the fp64 reference on its own keys.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/check.h"
#include "common/problem.h"
#include "common/reference.h"

namespace flashstep::test {

/// Pages of a paged test cache that no block table names, filled with NaN:
/// a read outside a sequence's own pages turns its output NaN.
inline constexpr std::int64_t kSparePages = 3;

/// A paged KV cache ([pages, H_kv, page_keys, d], split_kv_plan.h's
/// CacheLayout) holding the keys and values of a contiguous one
/// ([B, H_kv, Nk, d]): sequence b's Nk / page_keys pages are taken from the
/// pool in a shuffled order, so that no sequence's pages are consecutive or
/// in key order, and kSparePages pages more are NaN.
struct PagedCache {
  std::vector<float> K, V;          // [pages, H_kv, page_keys, d]
  std::vector<std::int32_t> table;  // [B, pages_per_seq]
  std::int64_t pages = 0, pages_per_seq = 0, page_keys = 0;
};

inline PagedCache page_cache(const Problem& p, const std::vector<float>& K,
                             const std::vector<float>& V, std::int64_t page_keys,
                             std::uint64_t seed) {
  PagedCache c;
  c.page_keys = page_keys;
  c.pages_per_seq = p.Nk / page_keys;
  c.pages = p.B * c.pages_per_seq + kSparePages;
  const std::int64_t page_elems = p.kv_heads() * page_keys * p.d;
  c.K.assign(static_cast<size_t>(c.pages * page_elems), NAN);
  c.V.assign(c.K.size(), NAN);
  std::vector<std::int32_t> order(static_cast<size_t>(c.pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  c.table.assign(order.begin(), order.begin() + p.B * c.pages_per_seq);
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.kv_heads(); ++h) {
      for (std::int64_t key = 0; key < p.Nk; ++key) {
        const std::int64_t page =
            c.table[static_cast<size_t>(b * c.pages_per_seq + key / page_keys)];
        const std::int64_t to = ((page * p.kv_heads() + h) * page_keys + key % page_keys) * p.d;
        const std::int64_t from = ((b * p.kv_heads() + h) * p.Nk + key) * p.d;
        std::copy(K.begin() + from, K.begin() + from + p.d, c.K.begin() + to);
        std::copy(V.begin() + from, V.begin() + from + p.d, c.V.begin() + to);
      }
    }
  }
  return c;
}

/// Key `key` of K/V head h of sequence b in `pool`, a pool laid out as c's
/// (the pages as read back after a call): its d values.
inline const float* paged_key(const Problem& p, const PagedCache& c, const std::vector<float>& pool,
                              std::int64_t b, std::int64_t h, std::int64_t key) {
  const std::int64_t page = c.table[static_cast<size_t>(b * c.pages_per_seq + key / c.page_keys)];
  return pool.data() + ((page * p.kv_heads() + h) * c.page_keys + key % c.page_keys) * p.d;
}

/// The new tokens K_new, V_new ([B, H_kv, Nq, d]) written into the contiguous
/// cache K, V ([B, H_kv, Nk, d]) at keys seqlens[b] .. seqlens[b] + Nq - 1
/// of each sequence: what the append does, on the host.
inline void append_contiguous(const Problem& p, std::vector<float>& K, std::vector<float>& V,
                              const std::vector<float>& K_new, const std::vector<float>& V_new,
                              const std::vector<std::int64_t>& seqlens) {
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.kv_heads(); ++h) {
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t to =
            ((b * p.kv_heads() + h) * p.Nk + seqlens[static_cast<size_t>(b)] + i) * p.d;
        const std::int64_t from = ((b * p.kv_heads() + h) * p.Nq + i) * p.d;
        std::copy(K_new.begin() + from, K_new.begin() + from + p.d, K.begin() + to);
        std::copy(V_new.begin() + from, V_new.begin() + from + p.d, V.begin() + to);
      }
    }
  }
}

/// O [B, H, Nq, d] and L [B, H, Nq] of a KV-cache forward, sequence by
/// sequence: sequence b against the fp64 reference of the problem on the
/// first keys[b] keys of the contiguous cache K, V ([B, H_kv, Nk, d]), its
/// queries Q's rows of b; keys[b] = 0 must give O = 0 and L = -inf.
inline void check_sequences(const Problem& p, const std::vector<float>& Q,
                            const std::vector<float>& K, const std::vector<float>& V,
                            const std::vector<std::int64_t>& keys, const float* O, const float* L) {
  const std::int64_t q_seq = p.H * p.Nq * p.d, rows_seq = p.H * p.Nq;
  for (std::int64_t b = 0; b < p.B; ++b) {
    CAPTURE(b);
    const std::int64_t n = keys[static_cast<size_t>(b)];
    if (n == 0) {
      std::int64_t wrong = 0;
      for (std::int64_t e = 0; e < q_seq; ++e) wrong += O[b * q_seq + e] != 0.0f;
      for (std::int64_t e = 0; e < rows_seq; ++e) wrong += L[b * rows_seq + e] != -INFINITY;
      CHECK(wrong == 0);
      continue;
    }
    Problem one = p;
    one.B = 1;
    one.Nk = n;
    Inputs seq;
    seq.Q.insert(seq.Q.end(), Q.begin() + b * q_seq, Q.begin() + (b + 1) * q_seq);
    for (std::int64_t h = 0; h < p.kv_heads(); ++h) {
      const std::int64_t at = (b * p.kv_heads() + h) * p.Nk * p.d;
      seq.K.insert(seq.K.end(), K.begin() + at, K.begin() + at + n * p.d);
      seq.V.insert(seq.V.end(), V.begin() + at, V.begin() + at + n * p.d);
    }
    const auto c = check_forward(one, O + b * q_seq, L + b * rows_seq, forward_truth(one, seq));
    CHECK_MESSAGE(c.ok(), c.summary());
  }
}

}  // namespace flashstep::test
