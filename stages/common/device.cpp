#include "device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "cuda_check.h"
#include "error.h"
#include "l2_flush.h"
#include "rounding.h"

namespace flashstep {

namespace {
// Byte pattern that makes every element NaN in all three types (0xFFFFFFFF in
// fp32, 0xFFFF in fp16 and bf16): an output element a stage forgets to write
// stays NaN and fails the comparison.
constexpr int kPoisonByte = 0xFF;
// Headroom left free on the device beyond what a run allocates (the CUDA
// context and allocator granularity need some).
constexpr std::int64_t kDeviceHeadroomBytes = 256ll << 20;

std::string gib(std::int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / static_cast<double>(1ll << 30)
    << " GiB";
  return s.str();
}

template <typename T>
T* device_alloc(std::int64_t bytes, const char* what) {
  void* ptr = nullptr;
  // cudaMalloc of 0 bytes returns null; allocate one element so pointers are valid.
  cuda_check(cudaMalloc(&ptr, static_cast<size_t>(std::max<std::int64_t>(bytes, 4))), what);
  return static_cast<T*>(ptr);
}

double percentile(std::vector<float> sorted_ms, double q) {
  const double pos = q * static_cast<double>(sorted_ms.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted_ms.size() - 1);
  const double t = pos - static_cast<double>(lo);
  return sorted_ms[lo] * (1.0 - t) + sorted_ms[hi] * t;
}
}  // namespace

void copy_to_device(void* dst, const float* src, std::int64_t n, DType t, const char* what) {
  if (t == DType::kFp32) {
    cuda_check(cudaMemcpy(dst, src, n * kFloatBytes, cudaMemcpyHostToDevice), what);
    return;
  }
  std::vector<std::uint16_t> bits(static_cast<size_t>(n));
  for (size_t k = 0; k < bits.size(); ++k) bits[k] = to_bits(t, src[k]);
  cuda_check(cudaMemcpy(dst, bits.data(), n * dtype_bytes(t), cudaMemcpyHostToDevice), what);
}

void copy_to_host(std::vector<float>& dst, const void* src, std::int64_t n, DType t,
                  const char* what) {
  dst.resize(static_cast<size_t>(n));
  if (t == DType::kFp32) {
    cuda_check(cudaMemcpy(dst.data(), src, n * kFloatBytes, cudaMemcpyDeviceToHost), what);
    return;
  }
  std::vector<std::uint16_t> bits(static_cast<size_t>(n));
  cuda_check(cudaMemcpy(bits.data(), src, n * dtype_bytes(t), cudaMemcpyDeviceToHost), what);
  for (size_t k = 0; k < bits.size(); ++k) dst[k] = from_bits(t, bits[k]);
}

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why) {
      *why = status == cudaErrorInsufficientDriver
                 ? std::string("no CUDA driver, or one older than this build's runtime")
             : status != cudaSuccess ? std::string(cudaGetErrorString(status))
                                     : std::string("no CUDA device found");
    }
    cudaGetLastError();  // clear the error so later calls start clean
    return false;
  }
  return true;
}

DeviceInfo device_info() {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.total_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
  cuda_check(cudaDeviceGetAttribute(&info.sm_clock_khz, cudaDevAttrClockRate, 0), "clock rate");
  cuda_check(cudaDeviceGetAttribute(&info.mem_clock_khz, cudaDevAttrMemoryClockRate, 0),
             "memory clock rate");
  cuda_check(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
  cuda_check(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
  return info;
}

bool stage_available(const Stage& stage, std::string* why) {
  const std::string name(stage.name);
  const std::string target = "sm_" + std::to_string(stage.arch) + "a";
  if (!stage.arch_built) {
    if (why) *why = "stage " + name + " is unavailable: this build did not compile it for " +
                    target + ", the architecture it needs";
    return false;
  }
  if (stage.arch == 0) return true;
  int major = 0, minor = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
             "compute capability");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0),
             "compute capability");
  // Arch-specific (sm_XXa) machine code runs on exactly that chip, and the
  // stage embeds no PTX a newer one could compile.
  if (major * 10 + minor == stage.arch) return true;
  if (why) {
    *why = "stage " + name + " is unavailable: it needs " + target + " (compute capability " +
           std::to_string(stage.arch / 10) + "." + std::to_string(stage.arch % 10) +
           "); this GPU is " + device_info().name + " (" + std::to_string(major) + "." +
           std::to_string(minor) + ")";
  }
  return false;
}

std::int64_t device_bytes_needed(const Stage& stage, const Problem& p, bool backward) {
  std::int64_t bytes = (2 * p.q_elems() + 2 * p.kv_elems()) * p.elem_bytes() +
                       p.lse_elems() * kFloatBytes + stage.workspace_bytes(p);
  if (backward) {
    if (!stage.backward) throw Error("stage " + std::string(stage.name) + " has no backward pass");
    bytes += (2 * p.q_elems() + 2 * p.kv_elems()) * p.elem_bytes() +
             stage.backward_workspace_bytes(p);
  }
  return bytes;
}

DeviceRun::DeviceRun(const Stage& stage, const Problem& p, const float* Q, const float* K,
                     const float* V, const float* dO)
    : stage_(stage), p_(p) {
  validate(p_);
  const bool backward = dO != nullptr;
  if (std::string why; !stage_available(stage, &why)) throw Error(why);
  require_dtype(stage, p.dtype);
  require_heads(stage, p);
  if (backward) {
    require_dtype(stage, p.dtype, true);
    require_heads(stage, p, true);
  }
  const std::int64_t need = device_bytes_needed(stage, p, backward);
  size_t free_bytes = 0, total_bytes = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (need + kDeviceHeadroomBytes > static_cast<std::int64_t>(free_bytes)) {
    throw Error("stage " + std::string(stage.name) + " needs " + gib(need) +
                " of device memory for " + p.describe() + ", but only " +
                gib(static_cast<std::int64_t>(free_bytes)) + " is free");
  }
  const std::int64_t E = p.elem_bytes();
  try {
    Q_ = device_alloc<void>(p.q_elems() * E, "cudaMalloc Q");
    K_ = device_alloc<void>(p.kv_elems() * E, "cudaMalloc K");
    V_ = device_alloc<void>(p.kv_elems() * E, "cudaMalloc V");
    O_ = device_alloc<void>(p.q_elems() * E, "cudaMalloc O");
    L_ = device_alloc<float>(p.lse_elems() * kFloatBytes, "cudaMalloc L");
    const std::int64_t ws = stage.workspace_bytes(p);
    if (ws > 0) workspace_ = device_alloc<void>(ws, "cudaMalloc workspace");
    if (backward) {
      dO_ = device_alloc<void>(p.q_elems() * E, "cudaMalloc dO");
      dQ_ = device_alloc<void>(p.q_elems() * E, "cudaMalloc dQ");
      dK_ = device_alloc<void>(p.kv_elems() * E, "cudaMalloc dK");
      dV_ = device_alloc<void>(p.kv_elems() * E, "cudaMalloc dV");
      const std::int64_t bws = stage.backward_workspace_bytes(p);
      if (bws > 0) backward_workspace_ = device_alloc<void>(bws, "cudaMalloc backward workspace");
      copy_to_device(dO_, dO, p.q_elems(), p.dtype, "copy dO");
    }
    copy_to_device(Q_, Q, p.q_elems(), p.dtype, "copy Q");
    copy_to_device(K_, K, p.kv_elems(), p.dtype, "copy K");
    copy_to_device(V_, V, p.kv_elems(), p.dtype, "copy V");
  } catch (...) {
    release();
    throw;
  }
}

DeviceRun::~DeviceRun() { release(); }

void DeviceRun::release() noexcept {
  for (void* ptr : {Q_, K_, V_, O_, static_cast<void*>(L_), workspace_, dO_, dQ_, dK_, dV_,
                    backward_workspace_}) {
    if (ptr) cudaFree(ptr);
  }
  Q_ = K_ = V_ = O_ = dO_ = dQ_ = dK_ = dV_ = nullptr;
  L_ = nullptr;
  workspace_ = backward_workspace_ = nullptr;
}

void DeviceRun::launch() {
  ForwardTensors t;
  t.Q = Q_;
  t.K = K_;
  t.V = V_;
  t.O = O_;
  t.L = stage_.writes_lse ? L_ : nullptr;
  t.workspace = workspace_;
  stage_.forward(p_, t, nullptr);
}

void DeviceRun::launch_backward() {
  BackwardTensors t;
  t.Q = Q_;
  t.K = K_;
  t.V = V_;
  t.O = O_;
  t.L = L_;
  t.dO = dO_;
  t.dQ = dQ_;
  t.dK = dK_;
  t.dV = dV_;
  t.saved = workspace_;
  t.workspace = backward_workspace_;
  stage_.backward(p_, t, nullptr);
}

void DeviceRun::run_backward(std::vector<float>& dQ, std::vector<float>& dK,
                             std::vector<float>& dV, std::vector<float>* O_read) {
  if (!dO_) throw Error("DeviceRun: the backward needs dO (pass it to the constructor)");
  std::vector<float> O, L;
  run(O, L);
  if (O_read != nullptr) *O_read = std::move(O);
  const std::int64_t E = p_.elem_bytes();
  cuda_check(cudaMemset(dQ_, kPoisonByte, p_.q_elems() * E), "poison dQ");
  cuda_check(cudaMemset(dK_, kPoisonByte, p_.kv_elems() * E), "poison dK");
  cuda_check(cudaMemset(dV_, kPoisonByte, p_.kv_elems() * E), "poison dV");
  launch_backward();
  cuda_check(cudaDeviceSynchronize(),
             std::string("stage " + std::string(stage_.name) + " backward").c_str());
  copy_to_host(dQ, dQ_, p_.q_elems(), p_.dtype, "copy dQ");
  copy_to_host(dK, dK_, p_.kv_elems(), p_.dtype, "copy dK");
  copy_to_host(dV, dV_, p_.kv_elems(), p_.dtype, "copy dV");
}

Timing DeviceRun::time_backward(int warmup, int iterations) {
  if (!dO_) throw Error("DeviceRun: the backward needs dO (pass it to the constructor)");
  launch();  // the forward's O, L and saved workspace, once: the backward only reads them
  return time_launches(warmup, iterations, &DeviceRun::launch_backward);
}

void DeviceRun::run(std::vector<float>& O, std::vector<float>& L) {
  cuda_check(cudaMemset(O_, kPoisonByte, p_.q_elems() * p_.elem_bytes()), "poison O");
  cuda_check(cudaMemset(L_, kPoisonByte, p_.lse_elems() * kFloatBytes), "poison L");
  launch();
  cuda_check(cudaDeviceSynchronize(), std::string("stage " + std::string(stage_.name)).c_str());
  copy_to_host(O, O_, p_.q_elems(), p_.dtype, "copy O");
  L.resize(static_cast<size_t>(p_.lse_elems()));
  cuda_check(cudaMemcpy(L.data(), L_, p_.lse_elems() * kFloatBytes, cudaMemcpyDeviceToHost),
             "copy L");
}

Timing DeviceRun::time(int warmup, int iterations) {
  return time_launches(warmup, iterations, &DeviceRun::launch);
}

Timing DeviceRun::time_launches(int warmup, int iterations, void (DeviceRun::*launch_fn)()) {
  return time_calls([&] { (this->*launch_fn)(); }, warmup, iterations,
                    "stage " + std::string(stage_.name));
}

Timing time_calls(const std::function<void()>& launch, int warmup, int iterations,
                  const std::string& what) {
  if (iterations < 1) throw Error("iterations must be >= 1");
  const std::int64_t flush_bytes = kL2FlushFactor * device_info().l2_bytes;
  void* flush = device_alloc<void>(l2_flush_allocation(flush_bytes), "cudaMalloc L2 flush buffer");
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<float> ms(static_cast<size_t>(iterations));
  try {
    zero_l2_flush_buffer(flush, flush_bytes);
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int k = 0; k < warmup; ++k) launch();
    for (int k = 0; k < iterations; ++k) {
      flush_l2(flush, flush_bytes, nullptr);
      cuda_check(cudaEventRecord(start), "cudaEventRecord");
      launch();
      cuda_check(cudaEventRecord(stop), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop), what.c_str());
      cuda_check(cudaEventElapsedTime(&ms[static_cast<size_t>(k)], start, stop),
                 "cudaEventElapsedTime");
    }
  } catch (...) {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    cudaFree(flush);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(flush);
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.median_ms = percentile(ms, 0.5);
  t.p20_ms = percentile(ms, 0.2);
  t.p80_ms = percentile(ms, 0.8);
  t.iterations = iterations;
  return t;
}

}  // namespace flashstep
