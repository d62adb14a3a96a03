// Ring attention on the GPUs (ring_runner.h): one process, one NCCL
// communicator per GPU, a compute and a communication stream each, the
// schedule of ring_schedule.h.
//
// One step on one GPU, with the overlap (the default):
//
//   comm stream     [wait compute t-1 if the schedule says] send block, recv next
//   compute stream  [wait recv t-1] partial, merge, partial, merge, ...
//
// The partials are whatever registered forward stage was asked for, called
// through its launcher on the chunk pair's sub-problem (ring_model.h's
// pair_problem); the merges are ring_merge.cu's kernels.
#include "ring_runner.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/l2_flush.h"
#include "common/rounding.h"
#include "ring_merge.h"
#include "ring_model.h"

namespace flashstep::ring {

namespace {

// Every output and partial element NaN in every type (as DeviceRun poisons).
constexpr int kPoisonByte = 0xFF;
// Free device memory left beyond the allocations (context, NCCL's buffers).
constexpr std::int64_t kDeviceHeadroomBytes = 1ll << 30;

void nccl_check(ncclResult_t status, const std::string& what) {
  if (status != ncclSuccess) {
    throw Error(what + ": " + ncclGetErrorString(status) + " (NCCL " +
                std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + ")");
  }
}

std::string gib(std::int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1)
    << static_cast<double>(bytes) / static_cast<double>(1ll << 30) << " GiB";
  return s.str();
}

// `elems` elements of `bytes` each past `base`.
template <typename T>
T* at(T* base, std::int64_t elems, std::int64_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(base) +
                              static_cast<std::uintptr_t>(elems * bytes));
}

// One GPU's share: its streams, communicator, buffers and events.
struct Gpu {
  int device = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  ncclComm_t nccl = nullptr;
  void* Q = nullptr;                  // Layout arrays 0..slots-1: [B, H, n, d], p.dtype
  std::array<void*, 3> kv{};          // Buffer kOwn, kRecv0, kRecv1: K and V arrays, p.dtype
  float* O_acc = nullptr;             // arrays 0..slots-1: [B, H, n, d], fp32
  float* L_acc = nullptr;             // lse(slot): [B, H, n], fp32; the output L
  void* O = nullptr;                  // arrays 0..slots-1: [B, H, n, d], p.dtype; the output O
  void* O_part = nullptr;             // [B, H, n_q, d], p.dtype: the pair being merged
  float* L_part = nullptr;            // [B, H, n_q]
  void* workspace = nullptr;          // the stage's, largest over the pairs
  void* flush = nullptr;              // L2 flush buffer
  std::int64_t flush_bytes = 0;
  cudaEvent_t start = nullptr, end = nullptr;
  // Per step t: the compute stream's start and end of the step, the
  // communication stream's start and end of transfer t.
  std::vector<cudaEvent_t> compute_begin, compute_done, comm_start, comm_end;
  std::int64_t bytes_sent = 0;
};

// A block's K and V chunks as they travel: (offset in the buffer, elements).
std::vector<std::pair<std::int64_t, std::int64_t>> block_parts(const Problem& p,
                                                               const Schedule& s,
                                                               const Layout& lay, int origin) {
  std::vector<std::pair<std::int64_t, std::int64_t>> parts;
  const std::vector<int> chunks = s.held(origin);
  for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
    const std::int64_t n = p.heads() * s.chunk(chunks[static_cast<size_t>(slot)]).size() * p.d;
    if (n == 0) continue;  // an empty chunk: neither side sends or receives it
    parts.push_back({lay.K(slot), n});
    parts.push_back({lay.V(slot), n});
  }
  return parts;
}

// host fp32 src [n] -> device dst [n] in type t, rounded to nearest even.
void upload(void* dst, const float* src, std::int64_t n, DType t) {
  if (t == DType::kFp32) {
    cuda_check(cudaMemcpy(dst, src, n * kFloatBytes, cudaMemcpyHostToDevice), "ring: copy to GPU");
    return;
  }
  std::vector<std::uint16_t> bits(static_cast<size_t>(n));
  for (size_t k = 0; k < bits.size(); ++k) bits[k] = to_bits(t, src[k]);
  cuda_check(cudaMemcpy(dst, bits.data(), n * dtype_bytes(t), cudaMemcpyHostToDevice),
             "ring: copy to GPU");
}

// device src [n] in type t -> host fp32 dst [n], widened exactly.
void download(float* dst, const void* src, std::int64_t n, DType t) {
  if (t == DType::kFp32) {
    cuda_check(cudaMemcpy(dst, src, n * kFloatBytes, cudaMemcpyDeviceToHost), "ring: copy O");
    return;
  }
  std::vector<std::uint16_t> bits(static_cast<size_t>(n));
  cuda_check(cudaMemcpy(bits.data(), src, n * dtype_bytes(t), cudaMemcpyDeviceToHost),
             "ring: copy O");
  for (size_t k = 0; k < bits.size(); ++k) dst[k] = from_bits(t, bits[k]);
}

// Milliseconds from a to b (events of one GPU, both complete).
double elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.0f;
  cuda_check(cudaEventElapsedTime(&ms, a, b), "ring: cudaEventElapsedTime");
  return ms;
}

// The stage's largest workspace over every pair the schedule computes.
std::int64_t largest_workspace(const Problem& p, const Schedule& s, const Stage& stage) {
  std::int64_t most = 0;
  for (int r = 0; r < s.ranks(); ++r) {
    for (int t = 0; t < s.ranks(); ++t) {
      for (const Pair& pair : s.step(r, t).pairs) {
        if (pair.kind != PairKind::kSkip) {
          most = std::max(most, stage.workspace_bytes(pair_problem(p, s, pair)));
        }
      }
    }
  }
  return most;
}

}  // namespace

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it: no driver or no device is an answer, not an error
    return 0;
  }
  return count;
}

struct RingRun::Impl {
  Problem p;
  Schedule s;
  const Stage& stage;
  bool overlap;
  Layout lay;
  std::vector<Gpu> gpus;

  Impl(const Problem& p_, const Schedule& s_, const Stage& stage_, bool overlap_)
      : p(p_), s(s_), stage(stage_), overlap(overlap_), lay(layout(s_, p_.heads(), p_.d)) {}
  ~Impl() { release(); }

  void allocate(const Inputs& in);
  void launch();
  void sync_all();
  void release() noexcept;
};

std::int64_t RingRun::device_bytes(const Problem& p, const Schedule& s, const Stage& stage) {
  const Layout lay = layout(s, p.heads(), p.d);
  const std::int64_t E = p.elem_bytes();
  return E * (lay.chunk_elems() /* Q */ + 3 * lay.kv_elems() + lay.chunk_elems() /* O */ +
              lay.capacity /* O_part */) +
         kFloatBytes * (lay.chunk_elems() /* O_acc */ + lay.lse_elems() + lay.lse_capacity) +
         largest_workspace(p, s, stage);
}

void RingRun::Impl::allocate(const Inputs& in) {
  const std::int64_t E = p.elem_bytes();
  const std::int64_t need = device_bytes(p, s, stage);
  const std::int64_t workspace = largest_workspace(p, s, stage);
  auto alloc = [](std::int64_t bytes, const char* what) {
    void* ptr = nullptr;
    cuda_check(cudaMalloc(&ptr, static_cast<size_t>(std::max<std::int64_t>(bytes, kFloatBytes))),
               what);
    return ptr;
  };
  std::vector<int> devices;
  for (int r = 0; r < s.ranks(); ++r) devices.push_back(r);
  gpus.resize(static_cast<size_t>(s.ranks()));
  for (int r = 0; r < s.ranks(); ++r) {
    Gpu& g = gpus[static_cast<size_t>(r)];
    g.device = r;
    cuda_check(cudaSetDevice(r), "ring: cudaSetDevice");
    size_t free_bytes = 0, total_bytes = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "ring: cudaMemGetInfo");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, r), "ring: cudaGetDeviceProperties");
    g.flush_bytes = kL2FlushFactor * prop.l2CacheSize;
    if (need + g.flush_bytes + kDeviceHeadroomBytes > static_cast<std::int64_t>(free_bytes)) {
      throw Error("ring: GPU " + std::to_string(r) + " needs " + gib(need + g.flush_bytes) +
                  " for " + p.describe() + " on " + std::to_string(s.ranks()) + " GPUs, but " +
                  gib(static_cast<std::int64_t>(free_bytes)) + " is free");
    }
    cuda_check(cudaStreamCreateWithFlags(&g.compute, cudaStreamNonBlocking), "ring: stream");
    cuda_check(cudaStreamCreateWithFlags(&g.comm, cudaStreamNonBlocking), "ring: stream");
    g.Q = alloc(lay.chunk_elems() * E, "ring: cudaMalloc Q");
    for (void*& b : g.kv) b = alloc(lay.kv_elems() * E, "ring: cudaMalloc K/V buffer");
    g.O_acc = static_cast<float*>(alloc(lay.chunk_elems() * kFloatBytes, "ring: cudaMalloc O_acc"));
    g.L_acc = static_cast<float*>(alloc(lay.lse_elems() * kFloatBytes, "ring: cudaMalloc L_acc"));
    g.O = alloc(lay.chunk_elems() * E, "ring: cudaMalloc O");
    g.O_part = alloc(lay.capacity * E, "ring: cudaMalloc O_part");
    g.L_part = static_cast<float*>(alloc(lay.lse_capacity * kFloatBytes, "ring: cudaMalloc L_part"));
    if (workspace > 0) g.workspace = alloc(workspace, "ring: cudaMalloc workspace");
    g.flush = alloc(l2_flush_allocation(g.flush_bytes), "ring: cudaMalloc L2 flush buffer");
    zero_l2_flush_buffer(g.flush, g.flush_bytes);
    for (cudaEvent_t* e : {&g.start, &g.end}) cuda_check(cudaEventCreate(e), "ring: event");
    for (auto* list : {&g.compute_begin, &g.compute_done, &g.comm_start, &g.comm_end}) {
      list->resize(static_cast<size_t>(s.ranks()));
      for (cudaEvent_t& e : *list) cuda_check(cudaEventCreate(&e), "ring: event");
    }
    // This GPU's chunks of Q, and its own K/V block, rounded to the type.
    const std::vector<int> chunks = s.held(r);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      const Chunk c = s.chunk(chunks[static_cast<size_t>(slot)]);
      const std::int64_t n = p.heads() * c.size() * p.d;
      std::vector<float> host(static_cast<size_t>(n));
      struct Part {
        const float* src;
        void* dst;
      };
      for (Part part : {Part{in.Q.data(), at(g.Q, lay.array(slot), E)},
                        Part{in.K.data(), at(g.kv[0], lay.K(slot), E)},
                        Part{in.V.data(), at(g.kv[0], lay.V(slot), E)}}) {
        gather_rows(part.src, p.heads(), p.Nq, p.d, c, host.data());
        upload(part.dst, host.data(), n, p.dtype);
      }
    }
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(s.ranks()));
  nccl_check(ncclCommInitAll(comms.data(), s.ranks(), devices.data()), "ring: ncclCommInitAll");
  for (int r = 0; r < s.ranks(); ++r) gpus[static_cast<size_t>(r)].nccl = comms[static_cast<size_t>(r)];
}

void RingRun::Impl::launch() {
  const std::int64_t E = p.elem_bytes();
  const int P = s.ranks();
  for (Gpu& g : gpus) {
    cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
    g.bytes_sent = 0;
    cuda_check(cudaEventRecord(g.start, g.compute), "ring: cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(g.comm, g.start, 0), "ring: cudaStreamWaitEvent");
    const std::vector<int> chunks = s.held(g.device);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      launch_init(g.O_acc + lay.array(slot), g.L_acc + lay.lse(slot),
                  p.heads() * s.chunk(chunks[static_cast<size_t>(slot)]).size(), p.d, g.compute);
    }
  }
  for (int t = 0; t < P; ++t) {
    const size_t step = static_cast<size_t>(t);
    if (t < P - 1) {
      // Transfer t: the block computed on at step t goes on to the next GPU,
      // the next one arrives in the other receive buffer.
      for (Gpu& g : gpus) {
        cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
        const Step st = s.step(g.device, t);
        if (t > 0 && (st.recv_waits_for_previous_compute || !overlap)) {
          cuda_check(cudaStreamWaitEvent(g.comm, g.compute_done[step - 1], 0),
                     "ring: cudaStreamWaitEvent");
        }
        cuda_check(cudaEventRecord(g.comm_start[step], g.comm), "ring: cudaEventRecord");
      }
      nccl_check(ncclGroupStart(), "ring: ncclGroupStart");
      for (Gpu& g : gpus) {
        const Step st = s.step(g.device, t);
        for (const auto& [offset, n] : block_parts(p, s, lay, st.origin)) {
          // Point-to-point moves bytes: no reduction, so the element type
          // does not matter to NCCL (and needs no ncclBfloat16).
          nccl_check(ncclSend(at(g.kv[static_cast<size_t>(st.compute_from)], offset, E),
                              static_cast<size_t>(n * E), ncclUint8, s.next(g.device), g.nccl,
                              g.comm),
                     "ring: ncclSend");
          g.bytes_sent += n * E;
        }
        for (const auto& [offset, n] : block_parts(p, s, lay, s.origin(s.prev(g.device), t))) {
          nccl_check(ncclRecv(at(g.kv[static_cast<size_t>(st.recv_into)], offset, E),
                              static_cast<size_t>(n * E), ncclUint8, s.prev(g.device), g.nccl,
                              g.comm),
                     "ring: ncclRecv");
        }
      }
      nccl_check(ncclGroupEnd(), "ring: ncclGroupEnd");
      for (Gpu& g : gpus) {
        cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
        cuda_check(cudaEventRecord(g.comm_end[step], g.comm), "ring: cudaEventRecord");
      }
    }
    // Step t's partials, each merged into its Q chunk's accumulator as it is written.
    for (Gpu& g : gpus) {
      cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
      const Step st = s.step(g.device, t);
      if (t > 0) {
        cuda_check(cudaStreamWaitEvent(g.compute, g.comm_end[step - 1], 0),
                   "ring: cudaStreamWaitEvent");
      }
      if (!overlap && t < P - 1) {
        cuda_check(cudaStreamWaitEvent(g.compute, g.comm_end[step], 0), "ring: cudaStreamWaitEvent");
      }
      cuda_check(cudaEventRecord(g.compute_begin[step], g.compute), "ring: cudaEventRecord");
      void* kv = g.kv[static_cast<size_t>(st.compute_from)];
      for (const Pair& pair : st.pairs) {
        if (pair.kind == PairKind::kSkip) continue;
        const Problem sub = pair_problem(p, s, pair);
        ForwardTensors ft;
        ft.Q = at(g.Q, lay.array(pair.q_slot), E);
        ft.K = at(kv, lay.K(pair.kv_slot), E);
        ft.V = at(kv, lay.V(pair.kv_slot), E);
        ft.O = g.O_part;
        ft.L = g.L_part;
        ft.workspace = g.workspace;
        stage.forward(sub, ft, g.compute);
        launch_merge(p.dtype, g.O_acc + lay.array(pair.q_slot), g.L_acc + lay.lse(pair.q_slot),
                     g.O_part, g.L_part, sub.lse_elems(), p.d, g.compute);
      }
      cuda_check(cudaEventRecord(g.compute_done[step], g.compute), "ring: cudaEventRecord");
    }
  }
  for (Gpu& g : gpus) {
    cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
    const std::vector<int> chunks = s.held(g.device);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      launch_finish(p.dtype, at(g.O, lay.array(slot), E), g.O_acc + lay.array(slot),
                    p.heads() * s.chunk(chunks[static_cast<size_t>(slot)]).size(), p.d, g.compute);
    }
    cuda_check(cudaEventRecord(g.end, g.compute), "ring: cudaEventRecord");
  }
}

void RingRun::Impl::sync_all() {
  for (Gpu& g : gpus) {
    cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
    cuda_check(cudaDeviceSynchronize(), ("ring: GPU " + std::to_string(g.device)).c_str());
  }
}

void RingRun::Impl::release() noexcept {
  for (Gpu& g : gpus) {
    if (cudaSetDevice(g.device) != cudaSuccess) continue;
    cudaDeviceSynchronize();
    if (g.nccl) ncclCommDestroy(g.nccl);
    for (void* ptr : {g.Q, g.kv[0], g.kv[1], g.kv[2], static_cast<void*>(g.O_acc),
                      static_cast<void*>(g.L_acc), g.O, g.O_part, static_cast<void*>(g.L_part),
                      g.workspace, g.flush}) {
      if (ptr) cudaFree(ptr);
    }
    for (cudaEvent_t e : {g.start, g.end}) {
      if (e) cudaEventDestroy(e);
    }
    for (auto* list : {&g.compute_begin, &g.compute_done, &g.comm_start, &g.comm_end}) {
      for (cudaEvent_t e : *list) {
        if (e) cudaEventDestroy(e);
      }
    }
    for (cudaStream_t st : {g.compute, g.comm}) {
      if (st) cudaStreamDestroy(st);
    }
  }
  gpus.clear();
  cudaSetDevice(0);
  cudaGetLastError();  // nothing left to report from a teardown
}

RingRun::RingRun(const Problem& p, const Schedule& s, const Stage& stage, bool overlap,
                 const Inputs& in) {
  validate_ring(p);
  require_partial_stage(stage, p);
  if (s.tokens() != p.Nq) {
    throw Error("ring: the schedule is for N = " + std::to_string(s.tokens()) +
                ", the problem has N = " + std::to_string(p.Nq));
  }
  const int visible = visible_gpus();
  if (s.ranks() > visible) {
    throw Error("ring: " + std::to_string(s.ranks()) + " GPUs asked for, " +
                std::to_string(visible) + " visible");
  }
  impl_ = std::make_unique<Impl>(p, s, stage, overlap);
  impl_->allocate(in);  // on an Error, impl_'s destructor frees what was allocated
}

RingRun::~RingRun() = default;

void RingRun::run(std::vector<float>& O, std::vector<float>& L) {
  Impl& m = *impl_;
  const std::int64_t E = m.p.elem_bytes();
  for (Gpu& g : m.gpus) {
    cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
    cuda_check(cudaMemset(g.O, kPoisonByte, m.lay.chunk_elems() * E), "ring: poison O");
    cuda_check(cudaMemset(g.O_acc, kPoisonByte, m.lay.chunk_elems() * kFloatBytes),
               "ring: poison O_acc");
    cuda_check(cudaMemset(g.L_acc, kPoisonByte, m.lay.lse_elems() * kFloatBytes),
               "ring: poison L_acc");
    cuda_check(cudaMemset(g.O_part, kPoisonByte, m.lay.capacity * E), "ring: poison O_part");
    cuda_check(cudaMemset(g.L_part, kPoisonByte, m.lay.lse_capacity * kFloatBytes),
               "ring: poison L_part");
  }
  m.sync_all();
  m.launch();
  m.sync_all();
  O.assign(static_cast<size_t>(m.p.q_elems()), NAN);
  L.assign(static_cast<size_t>(m.p.lse_elems()), NAN);
  for (Gpu& g : m.gpus) {
    cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
    const std::vector<int> chunks = m.s.held(g.device);
    for (int slot = 0; slot < static_cast<int>(chunks.size()); ++slot) {
      const Chunk c = m.s.chunk(chunks[static_cast<size_t>(slot)]);
      const std::int64_t rows = m.p.heads() * c.size();
      if (rows == 0) continue;
      std::vector<float> host(static_cast<size_t>(rows * m.p.d));
      download(host.data(), at(g.O, m.lay.array(slot), E), rows * m.p.d, m.p.dtype);
      scatter_rows(host.data(), m.p.heads(), m.p.Nq, m.p.d, c, O.data());
      host.resize(static_cast<size_t>(rows));
      cuda_check(cudaMemcpy(host.data(), g.L_acc + m.lay.lse(slot), rows * kFloatBytes,
                            cudaMemcpyDeviceToHost),
                 "ring: copy L");
      scatter_rows(host.data(), m.p.heads(), m.p.Nq, 1, c, L.data());
    }
  }
  cuda_check(cudaSetDevice(0), "ring: cudaSetDevice");
}

RingTiming RingRun::time(int warmup, int iterations) {
  if (iterations < 1) throw Error("iterations must be >= 1");
  Impl& m = *impl_;
  const int P = m.s.ranks();
  for (int k = 0; k < warmup; ++k) m.launch();
  m.sync_all();
  std::vector<float> ms;
  double comm_total = 0.0, comm_hidden = 0.0;
  std::vector<double> compute_ms(static_cast<size_t>(P), 0.0);
  for (int k = 0; k < iterations; ++k) {
    for (Gpu& g : m.gpus) {
      cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
      flush_l2(g.flush, g.flush_bytes, g.compute);
    }
    m.launch();
    m.sync_all();
    double slowest = 0.0;
    for (Gpu& g : m.gpus) {
      cuda_check(cudaSetDevice(g.device), "ring: cudaSetDevice");
      slowest = std::max(slowest, elapsed(g.start, g.end));
      // Each transfer's overlap with each step's compute, on this GPU's clock.
      for (int t = 0; t < P; ++t) {
        const double b = elapsed(g.start, g.compute_begin[static_cast<size_t>(t)]);
        const double e = elapsed(g.start, g.compute_done[static_cast<size_t>(t)]);
        compute_ms[static_cast<size_t>(g.device)] += e - b;
      }
      for (int t = 0; t + 1 < P; ++t) {
        const double cs = elapsed(g.start, g.comm_start[static_cast<size_t>(t)]);
        const double ce = elapsed(g.start, g.comm_end[static_cast<size_t>(t)]);
        comm_total += ce - cs;
        for (int u = 0; u < P; ++u) {
          const double b = elapsed(g.start, g.compute_begin[static_cast<size_t>(u)]);
          const double e = elapsed(g.start, g.compute_done[static_cast<size_t>(u)]);
          comm_hidden += std::max(0.0, std::min(ce, e) - std::max(cs, b));
        }
      }
    }
    ms.push_back(static_cast<float>(slowest));
  }
  cuda_check(cudaSetDevice(0), "ring: cudaSetDevice");
  std::sort(ms.begin(), ms.end());
  auto percentile = [&ms](double q) {
    const double pos = q * static_cast<double>(ms.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, ms.size() - 1);
    const double f = pos - static_cast<double>(lo);
    return ms[lo] * (1.0 - f) + ms[hi] * f;
  };
  RingTiming out;
  out.time.median_ms = percentile(0.5);
  out.time.p20_ms = percentile(0.2);
  out.time.p80_ms = percentile(0.8);
  out.time.iterations = iterations;
  out.comm_ms = comm_total / iterations / P;
  out.hidden = comm_total > 0.0 ? comm_hidden / comm_total : std::nan("");
  for (double& c : compute_ms) c /= iterations;
  out.compute_ms = compute_ms;
  return out;
}

std::vector<std::int64_t> RingRun::bytes_sent() const {
  std::vector<std::int64_t> out;
  for (const Gpu& g : impl_->gpus) out.push_back(g.bytes_sent);
  return out;
}

}  // namespace flashstep::ring
