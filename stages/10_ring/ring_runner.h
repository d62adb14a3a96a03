/// \file ring_runner.h
/// \brief Ring attention on the GPUs, one process driving them all through
/// NCCL (ring_runner.cpp). CUDA-free header; built only where NCCL is found.
///
/// One process, not one per GPU: the CLI, the tests and the fp64 check stay
/// one program with one set of host inputs and outputs, and no launcher
/// (mpirun, torchrun) is needed to start it. The price: one host thread
/// issues every GPU's work (a few launches per step and GPU, far below a
/// step's compute at the lengths the ring is for), and NCCL's point-to-point
/// calls of all ranks go in one ncclGroupStart/End, as NCCL requires when a
/// thread drives several ranks. A production job across nodes runs one
/// process per GPU; the schedule and the kernels would be the same.
///
/// Per GPU: a compute stream and a communication stream. At step t the
/// communication stream sends the block computed on at step t and receives
/// the next into the other receive buffer (ring_schedule.h's Buffer), while
/// the compute stream runs the partials of step t and merges each into its
/// accumulator; events make the compute of step t+1 wait for the receive,
/// and a receive wait for the compute still reading its buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/problem.h"
#include "common/stage.h"
#include "ring_schedule.h"

namespace flashstep::ring {

/// The number of CUDA devices visible (0 without a driver or device).
int visible_gpus();

/// Timings of a ring forward, and how much of its communication compute hid.
struct RingTiming {
  /// Per timed run, the slowest GPU's time from its start to its last merge
  /// (CUDA events on each GPU's compute stream; L2 flushed before each run).
  Timing time;
  /// Per run and GPU (mean over them), the time the transfers took: from the
  /// communication stream's start of each step's send/receive to its end.
  double comm_ms = 0.0;
  /// The share of that time during which the same GPU's compute stream was
  /// running a step (the transfer hidden behind compute), over every GPU and
  /// run; NaN when nothing was sent (one GPU).
  double hidden = 0.0;
  /// Per GPU, the mean per run of the time its compute stream ran steps:
  /// with causal contiguous chunks the last GPU's is far the largest.
  std::vector<double> compute_ms;
};

/// Device buffers, streams, events and NCCL communicators for one ring
/// forward of `p` (Nq = Nk) on GPUs 0 .. s.ranks()-1, each pair's partial
/// computed by `stage` (which must write L and run in p.dtype). The inputs
/// are host fp32 [B, H, N, d], rounded to p.dtype on their way to the GPUs.
/// Throws flashstep::Error (one line) when fewer GPUs are visible than the
/// schedule has ranks, when a GPU lacks the memory, or on a CUDA or NCCL error.
class RingRun {
 public:
  RingRun(const Problem& p, const Schedule& s, const Stage& stage, bool overlap,
          const Inputs& in);
  ~RingRun();
  RingRun(const RingRun&) = delete;
  RingRun& operator=(const RingRun&) = delete;

  /// Poisons every output and partial with NaN, runs the ring once, and
  /// gathers O [B, H, N, d] (widened to fp32) and L [B, H, N] to the host.
  void run(std::vector<float>& O, std::vector<float>& L);

  /// `warmup` untimed runs, then `iterations` timed ones.
  RingTiming time(int warmup, int iterations);

  /// Bytes each GPU handed to ncclSend in one run, in rank order.
  std::vector<std::int64_t> bytes_sent() const;

  /// Device bytes each GPU allocates: its Q chunks, three K/V buffers, the
  /// accumulators and O, one partial, and the stage's largest workspace.
  static std::int64_t device_bytes(const Problem& p, const Schedule& s, const Stage& stage);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashstep::ring
