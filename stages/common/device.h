/// \file device.h
/// \brief Running and timing a stage on the GPU from host code (CUDA-free header).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "problem.h"
#include "stage.h"

namespace flashstep {

/// The GPU the runs use, as recorded beside every result.
struct DeviceInfo {
  std::string name;              ///< e.g. "NVIDIA H200"
  int sm_count = 0;              ///< streaming multiprocessors
  std::int64_t l2_bytes = 0;     ///< L2 cache size
  std::int64_t total_bytes = 0;  ///< device memory
  int sm_clock_khz = 0;          ///< peak SM clock the driver reports
  int mem_clock_khz = 0;         ///< peak memory clock
  int driver_version = 0;        ///< e.g. 13000 for CUDA 13.0
  int runtime_version = 0;       ///< the CUDA runtime flashstep was built with
};

/// True when a CUDA device can be used; otherwise `why` says why not
/// (no device, no driver), in one line.
bool cuda_device_available(std::string* why = nullptr);

/// Properties of device 0. Requires cuda_device_available().
DeviceInfo device_info();

/// True when `stage` can run on device 0: it was built for the architecture
/// it needs (Stage::arch_built), and that is device 0's (Stage::arch, when
/// not 0). Otherwise `why` says why not in one line, e.g. "stage 08_hopper is
/// unavailable: it needs a Hopper GPU (sm_90a, compute capability 9.0); this
/// is NVIDIA A100-SXM4-80GB (8.0)". Requires cuda_device_available().
bool stage_available(const Stage& stage, std::string* why = nullptr);

/// Device bytes a run of `stage` on `p` allocates: Q, K, V, O (p.dtype), L
/// (fp32), workspace, and with `backward` also dO, dQ, dK, dV (p.dtype) and
/// the backward's workspace.
std::int64_t device_bytes_needed(const Stage& stage, const Problem& p, bool backward = false);

/// Host fp32 src [n] -> device dst [n] in type t, rounded to nearest even on
/// the way (fp16, bf16: rounding.h's to_bits). Throws flashstep::Error naming
/// `what` if the copy fails.
void copy_to_device(void* dst, const float* src, std::int64_t n, DType t, const char* what);

/// Device src [n] in type t -> host fp32 dst [n] (resized), widened exactly.
void copy_to_host(std::vector<float>& dst, const void* src, std::int64_t n, DType t,
                  const char* what);

/// Median and spread of repeated timings, in milliseconds.
struct Timing {
  double median_ms = 0.0;  ///< median over iterations
  double p20_ms = 0.0;     ///< 20th percentile
  double p80_ms = 0.0;     ///< 80th percentile
  int iterations = 0;      ///< timed iterations
};

/// `warmup` untimed calls of `launch` (which enqueues work on the default
/// stream), then `iterations` calls each timed with CUDA events, with L2
/// flushed (a buffer twice its size read: flush_l2) before each: the timing
/// every run of the CLI and the bench tools takes. `what` names the work in
/// an error.
Timing time_calls(const std::function<void()>& launch, int warmup, int iterations,
                  const std::string& what);

/// Device buffers for one stage on one problem: allocated once (after checking
/// that the stage runs in p.dtype and that they fit in free device memory,
/// with a clear Error if not), reused by every run and timing. Given dO
/// [B,H,Nq,d], it also holds the backward's buffers (the stage's backward
/// must run in p.dtype).
///
/// The host tensors are fp32 in every type: Q, K, V and dO are rounded to
/// p.dtype (to nearest even, as the device rounds) on their way to the device,
/// and O, dQ, dK and dV are widened (exactly) to fp32 on their way back.
class DeviceRun {
 public:
  DeviceRun(const Stage& stage, const Problem& p, const float* Q, const float* K,
            const float* V, const float* dO = nullptr);
  ~DeviceRun();
  DeviceRun(const DeviceRun&) = delete;
  DeviceRun& operator=(const DeviceRun&) = delete;

  /// Poisons O and L with NaN (every element must be written), runs the
  /// stage once, and copies O [B,H,Nq,d] (widened to fp32) and L [B,H,Nq]
  /// back to the host.
  void run(std::vector<float>& O, std::vector<float>& L);

  /// `warmup` untimed runs, then `iterations` runs each timed with CUDA
  /// events, with L2 flushed (a buffer twice its size read: flush_l2) before each.
  Timing time(int warmup, int iterations);

  /// Runs the forward (O and L poisoned first), then poisons dQ, dK and dV,
  /// runs the backward once, and copies the gradients back to the host; and,
  /// unless `O` is null, the forward's O [B,H,Nq,d] that the backward read
  /// (the low-precision gradient rule's naive backward reads the same O:
  /// common/check.h, backward_truth).
  void run_backward(std::vector<float>& dQ, std::vector<float>& dK, std::vector<float>& dV,
                    std::vector<float>* O = nullptr);

  /// Runs the forward once, then times the backward alone as time() does.
  Timing time_backward(int warmup, int iterations);

 private:
  const Stage& stage_;
  Problem p_;
  void* Q_ = nullptr;           // [B, H, Nq, d], p.dtype
  void* K_ = nullptr;           // [B, H_kv, Nk, d], p.dtype
  void* V_ = nullptr;           // [B, H_kv, Nk, d], p.dtype
  void* O_ = nullptr;           // [B, H, Nq, d], p.dtype
  float* L_ = nullptr;          // [B, H, Nq]
  void* workspace_ = nullptr;   // stage.workspace_bytes(p)
  void* dO_ = nullptr;          // [B, H, Nq, d], p.dtype
  void* dQ_ = nullptr;          // [B, H, Nq, d], p.dtype
  void* dK_ = nullptr;          // [B, H_kv, Nk, d], p.dtype
  void* dV_ = nullptr;          // [B, H_kv, Nk, d], p.dtype
  void* backward_workspace_ = nullptr;  // stage.backward_workspace_bytes(p)
  void release() noexcept;
  void launch();
  void launch_backward();
  Timing time_launches(int warmup, int iterations, void (DeviceRun::*launch_fn)());
};

}  // namespace flashstep
