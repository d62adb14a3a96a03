/// \file parallel.h
/// \brief The host's cores for the fp64 reference and the naive checks: one
/// loop over independent heads, shared out to threads.
///
/// The checks dominate a GPU test or benchmark point on the host (a decoding
/// point holds hundreds of heads of 32k keys; the GPU finishes in a
/// millisecond). Every index of the loop writes only its own outputs, so the
/// results are the serial loop's, bit for bit, whatever the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flashstep {

/// Runs body(i) for every i in [0, n), on up to the host's hardware threads,
/// each taking the next index when it is free (heads of one problem cost the
/// same, but causal rows and grouped heads do not). body must not write what
/// another index reads or writes. An exception thrown by body stops the
/// loop's remaining indices and is rethrown here.
template <typename Body>
void parallel_for(std::int64_t n, Body body) {
  const auto cores = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t workers = std::min(cores, n);
  if (workers <= 1) {
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (std::int64_t i = next++; i < n; i = next++) {
      try {
        body(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;  // the other threads take no new index
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (std::int64_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashstep
