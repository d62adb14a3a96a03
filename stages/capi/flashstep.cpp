// The C ABI of flashstep.h: argument checks that need no GPU first, then the
// CUDA-side checks, a per-call workspace, and the stage's forward or backward
// on the caller's stream. Every failure becomes a code plus a thread-local
// message.
#include "flashstep.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <iomanip>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/problem.h"
#include "common/stage.h"
#if FLASHSTEP_HAVE_SPLIT_KV
#include "09_split_kv/split_kv.h"
#endif

namespace {

using flashstep::DType;
using flashstep::Problem;
using flashstep::Stage;

// Per thread, like errno: two threads calling at once each read their own.
thread_local std::string t_last_error;

// Free device memory left beyond a workspace, for the allocator's granularity
// and whatever the caller's next kernels need; a workspace from this size up
// that would leave less is refused with ENOMEM before allocating. Smaller ones
// are not checked first: cudaMemGetInfo costs about 5 us of host time a call
// (H200, tuning_09 run 13), as much as a short decode's kernels, and a
// failed allocation still says how much was free.
constexpr std::int64_t kWorkspaceHeadroomBytes = 64ll << 20;
// ForwardTensors promises the workspace 256-byte aligned.
constexpr std::uintptr_t kWorkspaceAlign = 256;

// A failure with its code; the entry points turn it into a return value.
class CapiError : public flashstep::Error {
 public:
  CapiError(int code, const std::string& what) : flashstep::Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

[[noreturn]] void fail(int code, const std::string& what) { throw CapiError(code, what); }

std::string address(const void* ptr) {
  std::ostringstream s;
  s << ptr;
  return s.str();
}

std::string gib(std::int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2)
    << static_cast<double>(bytes) / static_cast<double>(1ll << 30) << " GiB";
  return s.str();
}

// Runs `body`, turning whatever it throws into a status code and the message.
template <typename Body>
int guarded(Body&& body) {
  try {
    body();
    t_last_error.clear();
    return FLASHSTEP_OK;
  } catch (const CapiError& e) {
    t_last_error = e.what();
    return e.code();
  } catch (const flashstep::Error& e) {  // from a stage's forward: a CUDA failure
    t_last_error = e.what();
    return FLASHSTEP_ECUDA;
  } catch (const std::bad_alloc&) {
    t_last_error = "out of host memory";
    return FLASHSTEP_ENOMEM;
  } catch (const std::exception& e) {
    t_last_error = std::string("internal error: ") + e.what();
    return FLASHSTEP_EINTERNAL;
  } catch (...) {
    t_last_error = "internal error: unknown exception";
    return FLASHSTEP_EINTERNAL;
  }
}

// The stage a name or number selects; exactly one, or ESTAGE.
const Stage& find_stage(const char* name) {
  if (name == nullptr) fail(FLASHSTEP_EINVAL, "stage is NULL");
  std::vector<const Stage*> found;
  try {
    found = flashstep::select_stages(name);
  } catch (const flashstep::Error& e) {
    fail(FLASHSTEP_ESTAGE, e.what());
  }
  if (found.size() != 1) {
    std::string names;
    for (const Stage* s : found) names += (names.empty() ? "" : ", ") + std::string(s->name);
    fail(FLASHSTEP_ESTAGE, "stage '" + std::string(name) + "' selects " +
                               std::to_string(found.size()) + " stages (" + names +
                               "); name exactly one");
  }
  return *found.front();
}

// One tensor argument: its name, pointer, size in bytes, and the type of its
// elements (every pointer must be aligned to one element).
struct Tensor {
  const char* name;
  const void* ptr;
  std::int64_t bytes;
  DType type;
  const char* element = nullptr;  // the element's name where it is not `type`'s (int32)
};

bool overlap(const Tensor& a, const Tensor& b) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.ptr);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.ptr);
  return a0 < b0 + static_cast<std::uintptr_t>(b.bytes) &&
         b0 < a0 + static_cast<std::uintptr_t>(a.bytes);
}

// Clears the runtime's last-error state after a failed call of ours, so the
// caller's next error check (PyTorch checks after each launch) does not
// report our failure as its own. Returns the status unchanged.
cudaError_t cleared(cudaError_t status) {
  if (status != cudaSuccess) cudaGetLastError();
  return status;
}

void cuda_or_fail(cudaError_t status, const std::string& what) {
  if (cleared(status) != cudaSuccess) {
    fail(FLASHSTEP_ECUDA, what + ": " + cudaGetErrorString(status));
  }
}

// Every tensor must be device memory of the current device, or managed memory.
void check_device_pointers(const std::vector<Tensor>& tensors) {
  int device = -1;
  const cudaError_t status = cleared(cudaGetDevice(&device));
  if (status != cudaSuccess) {
    fail(FLASHSTEP_ECUDA, std::string("no usable CUDA device: ") + cudaGetErrorString(status));
  }
  for (const Tensor& t : tensors) {
    cudaPointerAttributes attr{};
    cuda_or_fail(cudaPointerGetAttributes(&attr, t.ptr),
                 std::string("cudaPointerGetAttributes(") + t.name + ")");
    if (attr.type == cudaMemoryTypeManaged) continue;
    if (attr.type != cudaMemoryTypeDevice) {
      fail(FLASHSTEP_EINVAL, std::string(t.name) + " (" + address(t.ptr) + ") is " +
                                 (attr.type == cudaMemoryTypeHost ? "pinned host" : "host") +
                                 " memory; it must be device or managed memory");
    }
    if (attr.device != device) {
      fail(FLASHSTEP_EINVAL, std::string(t.name) + " is on device " +
                                 std::to_string(attr.device) + " but the current device is " +
                                 std::to_string(device));
    }
  }
}

// Free device memory now, in bytes.
std::int64_t free_device_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  cuda_or_fail(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return static_cast<std::int64_t>(free_bytes);
}

// Scratch memory for one call (`need` bytes, 256-byte aligned; `who` names its
// user in messages), allocated and freed in stream order where the device has
// memory pools, else with cudaMalloc (and a stream sync before the free).
class Workspace {
 public:
  Workspace(std::int64_t need, const std::string& who, const Problem& p, cudaStream_t stream)
      : stream_(stream) {
    if (need <= 0) return;
    const std::int64_t bytes = need + static_cast<std::int64_t>(kWorkspaceAlign);
    if (bytes >= kWorkspaceHeadroomBytes) {
      const std::int64_t free_bytes = free_device_bytes();
      if (bytes + kWorkspaceHeadroomBytes > free_bytes) refuse(need, who, p, free_bytes);
    }
    int device = 0, pools = 0;
    cuda_or_fail(cudaGetDevice(&device), "cudaGetDevice");
    cuda_or_fail(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device),
                 "cudaDeviceGetAttribute");
    async_ = pools != 0;
    const cudaError_t status = cleared(
        async_ ? cudaMallocAsync(&raw_, static_cast<size_t>(bytes), stream_)
               : cudaMalloc(&raw_, static_cast<size_t>(bytes)));
    if (status != cudaSuccess) {
      raw_ = nullptr;
      if (status == cudaErrorMemoryAllocation) refuse(need, who, p, free_device_bytes());
      fail(FLASHSTEP_ECUDA, "allocating " + gib(need) + " of workspace for " + who + ": " +
                                cudaGetErrorString(status));
    }
    const auto base = reinterpret_cast<std::uintptr_t>(raw_);
    aligned_ = reinterpret_cast<void*>((base + kWorkspaceAlign - 1) / kWorkspaceAlign *
                                       kWorkspaceAlign);
  }
  ~Workspace() {
    if (!raw_) return;
    if (async_) {
      cleared(cudaFreeAsync(raw_, stream_));
    } else {
      cleared(cudaStreamSynchronize(stream_));
      cleared(cudaFree(raw_));
    }
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* get() const { return aligned_; }
  /// The byte at `offset` into the aligned workspace.
  void* at(std::int64_t offset) const { return static_cast<char*>(aligned_) + offset; }

 private:
  [[noreturn]] static void refuse(std::int64_t need, const std::string& who, const Problem& p,
                                  std::int64_t free_bytes) {
    fail(FLASHSTEP_ENOMEM, who + " needs " + gib(need) + " of device workspace for " +
                               p.describe() + ", but only " + gib(free_bytes) + " is free");
  }

  cudaStream_t stream_;
  bool async_ = false;
  void* raw_ = nullptr;
  void* aligned_ = nullptr;
};

// NUL-terminated copies of every stage's name and title, made once: the
// registry holds string_views, which C callers cannot read as C strings.
struct StageStrings {
  std::vector<std::string> names;
  std::vector<std::string> titles;
};

const StageStrings& stage_strings() {
  static const StageStrings strings = [] {
    StageStrings out;
    for (const Stage& s : flashstep::all_stages()) {
      out.names.emplace_back(s.name);
      out.titles.emplace_back(s.title);
    }
    return out;
  }();
  return strings;
}

// The problem, or EINVAL with validate's message.
void check_problem(const Problem& p) {
  try {
    flashstep::validate(p);
  } catch (const flashstep::Error& e) {
    fail(FLASHSTEP_EINVAL, e.what());
  }
}

// Every tensor aligned to one of its elements.
void check_aligned(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    const auto align = static_cast<std::uintptr_t>(flashstep::dtype_bytes(t.type));
    if (reinterpret_cast<std::uintptr_t>(t.ptr) % align != 0) {
      const std::string element = t.element          ? std::string(t.element)
                                  : t.type == DType::kFp32 ? std::string("float")
                                  : std::string(flashstep::dtype_name(t.type)) + " element";
      fail(FLASHSTEP_EINVAL, std::string(t.name) + " (" + address(t.ptr) + ") is not aligned to " +
                                 std::to_string(align) + " bytes (one " + element + ")");
    }
  }
}

// flashstep_dtype codes and the element types they name.
int dtype_code(DType t) {
  switch (t) {
    case DType::kFp32: return FLASHSTEP_FP32;
    case DType::kFp16: return FLASHSTEP_FP16;
    case DType::kBf16: return FLASHSTEP_BF16;
  }
  return -1;  // not reached: every enumerator is named above
}

DType dtype_of(int code) {
  for (DType t : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    if (dtype_code(t) == code) return t;
  }
  fail(FLASHSTEP_EINVAL, "dtype must be FLASHSTEP_FP32 (0), FLASHSTEP_FP16 (1) or "
                         "FLASHSTEP_BF16 (2), got " + std::to_string(code));
}

// Bit (1 << code) set for each of the types.
int dtype_bits(const std::vector<DType>& types) {
  int bits = 0;
  for (DType t : types) bits |= 1 << dtype_code(t);
  return bits;
}

// The stage's forward (or backward) runs in `t`, or ESTAGE naming its types.
void check_stage_dtype(const Stage& stage, DType t, bool backward) {
  try {
    flashstep::require_dtype(stage, t, backward);
  } catch (const flashstep::Error& e) {
    fail(FLASHSTEP_ESTAGE, e.what());
  }
}

// The stage runs p's heads (H_kv < H needs Stage::grouped_heads, and with
// `backward` Stage::grouped_backward), or ESTAGE.
void check_stage_heads(const Stage& stage, const Problem& p, bool backward = false) {
  try {
    flashstep::require_heads(stage, p, backward);
  } catch (const flashstep::Error& e) {
    fail(FLASHSTEP_ESTAGE, e.what());
  }
}

// The outputs come after the inputs in `tensors`, from `first_output` on:
// each must overlap nothing before it. Inputs may share memory (Q == K).
void check_outputs_apart(const std::vector<Tensor>& tensors, size_t first_output) {
  for (size_t out = first_output; out < tensors.size(); ++out) {
    for (size_t other = 0; other < out; ++other) {
      if (overlap(tensors[out], tensors[other])) {
        fail(FLASHSTEP_EINVAL, std::string(tensors[out].name) + " overlaps " +
                                   tensors[other].name + "; outputs need memory of their own");
      }
    }
  }
}

// The problem as the entry points take it: scale <= 0 or NaN means 1/sqrt(d).
Problem make_problem(std::int64_t B, std::int64_t H, std::int64_t Nq, std::int64_t Nk,
                     std::int64_t d, int causal, double scale) {
  Problem p;
  p.B = B;
  p.H = H;
  p.Nq = Nq;
  p.Nk = Nk;
  p.d = d;
  p.causal = causal != 0;
  if (!std::isnan(scale) && scale > 0.0) p.scale = scale;  // +Inf: validate refuses it
  return p;
}

// Bytes of an int32 (cache_seqlens, block_table), checked for alignment as
// 4-byte elements.
constexpr std::int64_t kInt32Bytes = 4;

// Stage 09's KV-cache forward (flashstep_forward_kvcache), the checks in the
// documented order.
struct KvCacheArgs {
  const void* Q;
  void* K_cache;
  void* V_cache;
  const std::int32_t* seqlens;
  const std::int32_t* block_table;
  std::int64_t num_pages, pages_per_seq, page_keys;
  const void* K_new;
  const void* V_new;
  void* O;
  float* L;
};

void forward_kvcache([[maybe_unused]] Problem p, [[maybe_unused]] int dtype,
                     [[maybe_unused]] const KvCacheArgs& a, [[maybe_unused]] void* stream_handle) {
#if !FLASHSTEP_HAVE_SPLIT_KV
  fail(FLASHSTEP_ESTAGE, "flashstep_forward_kvcache needs stage 09_split_kv, which this build "
                         "leaves out (FLASHSTEP_STAGES_ONLY)");
#else
  namespace sk = flashstep::split_kv;
  p.dtype = dtype_of(dtype);
  check_problem(p);
  const bool paged = a.block_table != nullptr;
  if (!paged && a.num_pages != 0) fail(FLASHSTEP_EINVAL, "num_pages without a block table");
  if (paged && a.num_pages < 1) {
    fail(FLASHSTEP_EINVAL, "num_pages must be >= 1 with a block table, got " +
                               std::to_string(a.num_pages));
  }
  const sk::CacheLayout layout{a.block_table, a.pages_per_seq, a.page_keys};
  try {
    sk::validate_kvcache(p, nullptr, nullptr, a.K_cache, a.V_cache, a.seqlens, layout, a.K_new,
                         a.V_new);
  } catch (const flashstep::Error& e) {
    fail(FLASHSTEP_EINVAL, e.what());
  }
  const DType E = p.dtype;
  const std::int64_t row_bytes = p.d * p.elem_bytes();  // one key or query row
  // The pool's size in bytes must be a number (page_keys is at most the
  // capacity, validate_kvcache; num_pages is the caller's).
  if (paged && a.num_pages > std::numeric_limits<std::int64_t>::max() /
                                 (p.kv_heads() * a.page_keys * row_bytes)) {
    fail(FLASHSTEP_EINVAL, "num_pages " + std::to_string(a.num_pages) +
                               ": the pool [num_pages, H_kv, page_keys, d] is more bytes than "
                               "64 bits count");
  }
  const std::int64_t cache_rows =
      paged ? a.num_pages * p.kv_heads() * a.page_keys : p.B * p.kv_heads() * p.Nk;
  const std::int64_t q_bytes = p.q_elems() * p.elem_bytes();
  const bool appends = a.K_new != nullptr;
  // Inputs, then what is written: the cache when appending, O and L.
  std::vector<Tensor> tensors = {{"Q", a.Q, q_bytes, E},
                                 {"cache_seqlens", a.seqlens, p.B * kInt32Bytes, DType::kFp32, "int32"}};
  if (paged) {
    tensors.push_back(
        {"block_table", a.block_table, p.B * a.pages_per_seq * kInt32Bytes, DType::kFp32, "int32"});
  }
  if (appends) {
    const std::int64_t new_bytes = p.B * p.kv_heads() * p.Nq * row_bytes;
    tensors.push_back({"K_new", a.K_new, new_bytes, E});
    tensors.push_back({"V_new", a.V_new, new_bytes, E});
  }
  const size_t first_output = appends ? tensors.size() : tensors.size() + 2;
  tensors.push_back({"K_cache", a.K_cache, cache_rows * row_bytes, E});
  tensors.push_back({"V_cache", a.V_cache, cache_rows * row_bytes, E});
  tensors.push_back({"O", a.O, q_bytes, E});
  tensors.push_back({"L", a.L, p.lse_elems() * flashstep::kFloatBytes, DType::kFp32});
  for (const Tensor& t : tensors) {
    if (t.ptr == nullptr) fail(FLASHSTEP_EINVAL, std::string(t.name) + " is NULL");
  }
  check_aligned(tensors);  // the int32 arrays as 4-byte elements
  check_outputs_apart(tensors, first_output);

  check_device_pointers(tensors);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  Workspace workspace(sk::workspace_bytes(p), "stage 09_split_kv's KV-cache forward", p, stream);
  flashstep::ForwardTensors t;
  t.Q = a.Q;
  t.O = a.O;
  t.L = a.L;
  t.workspace = workspace.get();
  sk::KvCache cache;
  cache.K = a.K_cache;
  cache.V = a.V_cache;
  cache.seqlens = a.seqlens;
  cache.layout = layout;
  cache.K_new = a.K_new;
  cache.V_new = a.V_new;
  sk::forward_kvcache(p, t, cache, stream);
#endif
}

// The registered stages that have a backward, as "02_safe_softmax, 05_...".
std::string stages_with_backward() {
  std::string names;
  for (const Stage& s : flashstep::all_stages()) {
    if (s.backward) names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  return names;
}

std::int64_t round_up_to_align(std::int64_t bytes) {
  constexpr auto kAlign = static_cast<std::int64_t>(kWorkspaceAlign);
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

void forward(const char* stage_name, int dtype, Problem p, const void* Q, const void* K,
             const void* V, void* O, float* L, void* stream_handle) {
  // Checks that need no GPU, in the documented order.
  const Stage& stage = find_stage(stage_name);
  p.dtype = dtype_of(dtype);
  check_stage_dtype(stage, p.dtype, false);
  check_problem(p);
  check_stage_heads(stage, p);
  const DType E = p.dtype;
  const std::int64_t q_bytes = p.q_elems() * p.elem_bytes();
  const std::int64_t kv_bytes = p.kv_elems() * p.elem_bytes();
  const std::int64_t lse_bytes = p.lse_elems() * flashstep::kFloatBytes;
  std::vector<Tensor> tensors = {
      {"Q", Q, q_bytes, E}, {"K", K, kv_bytes, E}, {"V", V, kv_bytes, E}, {"O", O, q_bytes, E}};
  for (const Tensor& t : tensors) {
    if (t.ptr == nullptr) fail(FLASHSTEP_EINVAL, std::string(t.name) + " is NULL");
  }
  if (stage.writes_lse) {
    if (L == nullptr) {
      fail(FLASHSTEP_EINVAL, "L is NULL but stage " + std::string(stage.name) +
                                 " writes L [B,H,Nq]; pass a buffer of B*H*Nq floats");
    }
    tensors.push_back({"L", L, lse_bytes, DType::kFp32});
  }
  check_aligned(tensors);
  constexpr size_t kFirstOutput = 3;  // O, and L when written
  check_outputs_apart(tensors, kFirstOutput);

  // Checks through CUDA, then the run.
  check_device_pointers(tensors);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  Workspace workspace(stage.workspace_bytes(p), "stage " + std::string(stage.name), p, stream);
  flashstep::ForwardTensors t;
  t.Q = Q;
  t.K = K;
  t.V = V;
  t.O = O;
  t.L = stage.writes_lse ? L : nullptr;
  t.workspace = workspace.get();
  stage.forward(p, t, stream);
}

// The backward's one scratch allocation, in 256-byte aligned pieces: the
// backward's own workspace, then, for a stage whose forward saves state in its
// workspace (BackwardTensors::saved; stage 02: P), that workspace and the
// scratch O and L the forward's re-run writes instead of the caller's.
struct BackwardScratch {
  bool rerun_forward = false;
  std::int64_t saved = 0, O = 0, L = 0;  // byte offsets, when rerun_forward
  std::int64_t total = 0;                // bytes

  BackwardScratch(const Stage& stage, const Problem& p) {
    const std::int64_t own = stage.backward_workspace_bytes(p);
    const std::int64_t forward_ws = stage.workspace_bytes(p);
    rerun_forward = forward_ws > 0;
    total = own;
    if (!rerun_forward) return;
    saved = round_up_to_align(own);
    O = saved + round_up_to_align(forward_ws);
    L = O + round_up_to_align(p.q_elems() * p.elem_bytes());
    total = L + p.lse_elems() * flashstep::kFloatBytes;
  }
};

void backward(const char* stage_name, int dtype, Problem p, const void* Q, const void* K,
              const void* V, const void* O, const float* L, const void* dO, void* dQ, void* dK,
              void* dV, void* stream_handle) {
  // Checks that need no GPU, in the documented order.
  const Stage& stage = find_stage(stage_name);
  if (!stage.backward) {
    fail(FLASHSTEP_ESTAGE, "stage " + std::string(stage.name) +
                               " has no backward pass; stages with one: " +
                               stages_with_backward());
  }
  p.dtype = dtype_of(dtype);
  check_stage_dtype(stage, p.dtype, true);
  check_problem(p);
  check_stage_heads(stage, p, true);
  const DType E = p.dtype;
  const std::int64_t q_bytes = p.q_elems() * p.elem_bytes();
  const std::int64_t kv_bytes = p.kv_elems() * p.elem_bytes();
  const std::int64_t lse_bytes = p.lse_elems() * flashstep::kFloatBytes;
  const std::vector<Tensor> tensors = {
      {"Q", Q, q_bytes, E},   {"K", K, kv_bytes, E},   {"V", V, kv_bytes, E},
      {"O", O, q_bytes, E},   {"L", L, lse_bytes, DType::kFp32},  {"dO", dO, q_bytes, E},
      {"dQ", dQ, q_bytes, E}, {"dK", dK, kv_bytes, E}, {"dV", dV, kv_bytes, E}};
  for (const Tensor& t : tensors) {
    if (t.ptr == nullptr) fail(FLASHSTEP_EINVAL, std::string(t.name) + " is NULL");
  }
  check_aligned(tensors);
  constexpr size_t kFirstOutput = 6;  // dQ, dK, dV
  check_outputs_apart(tensors, kFirstOutput);

  // Checks through CUDA, then the run: the forward again where the backward
  // reads what it saved, then the backward, in order on one stream.
  check_device_pointers(tensors);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const BackwardScratch layout(stage, p);
  const std::string who = "stage " + std::string(stage.name) + "'s backward" +
                          (layout.rerun_forward ? " (with its forward's re-run)" : "");
  Workspace workspace(layout.total, who, p, stream);
  flashstep::BackwardTensors t;
  if (layout.rerun_forward) {
    flashstep::ForwardTensors f;
    f.Q = Q;
    f.K = K;
    f.V = V;
    f.O = workspace.at(layout.O);
    f.L = stage.writes_lse ? static_cast<float*>(workspace.at(layout.L)) : nullptr;
    f.workspace = workspace.at(layout.saved);
    stage.forward(p, f, stream);
    t.saved = f.workspace;
  }
  t.Q = Q;
  t.K = K;
  t.V = V;
  t.O = O;
  t.L = L;
  t.dO = dO;
  t.dQ = dQ;
  t.dK = dK;
  t.dV = dV;
  t.workspace = workspace.get();
  stage.backward(p, t, stream);
}

}  // namespace

extern "C" {

int flashstep_stage_count(void) {
  int count = 0;
  guarded([&] { count = static_cast<int>(flashstep::all_stages().size()); });
  return count;
}

const char* flashstep_stage_name(int i) {
  const char* name = nullptr;
  guarded([&] {
    const auto& names = stage_strings().names;
    if (i >= 0 && static_cast<size_t>(i) < names.size()) {
      name = names[static_cast<size_t>(i)].c_str();
    }
  });
  return name;
}

const char* flashstep_stage_title(int i) {
  const char* title = nullptr;
  guarded([&] {
    const auto& titles = stage_strings().titles;
    if (i >= 0 && static_cast<size_t>(i) < titles.size()) {
      title = titles[static_cast<size_t>(i)].c_str();
    }
  });
  return title;
}

int flashstep_stage_writes_lse(const char* stage) {
  int writes = -1;
  guarded([&] { writes = find_stage(stage).writes_lse ? 1 : 0; });
  return writes;
}

int flashstep_stage_has_backward(const char* stage) {
  int has = -1;
  guarded([&] { has = find_stage(stage).backward ? 1 : 0; });
  return has;
}

int flashstep_stage_dtypes(const char* stage) {
  int bits = -1;
  guarded([&] { bits = dtype_bits(find_stage(stage).dtypes); });
  return bits;
}

int flashstep_stage_backward_dtypes(const char* stage) {
  int bits = -1;
  guarded([&] {
    const Stage& s = find_stage(stage);
    bits = s.backward ? dtype_bits(s.backward_dtypes) : 0;
  });
  return bits;
}

int flashstep_forward(const char* stage, int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                      int64_t d, int causal, double scale, const float* Q, const float* K,
                      const float* V, float* O, float* L, void* stream) {
  return flashstep_forward_typed(stage, FLASHSTEP_FP32, B, H, Nq, Nk, d, causal, scale, Q, K, V,
                                 O, L, stream);
}

int flashstep_forward_typed(const char* stage, int dtype, int64_t B, int64_t H, int64_t Nq,
                            int64_t Nk, int64_t d, int causal, double scale, const void* Q,
                            const void* K, const void* V, void* O, float* L, void* stream) {
  return guarded([&] {
    forward(stage, dtype, make_problem(B, H, Nq, Nk, d, causal, scale), Q, K, V, O, L, stream);
  });
}

int flashstep_forward_v2(const char* stage, int dtype, int64_t B, int64_t H, int64_t H_kv,
                         int64_t Nq, int64_t Nk, int64_t d, int causal, double scale,
                         const void* Q, const void* K, const void* V, void* O, float* L,
                         void* stream) {
  return guarded([&] {
    Problem p = make_problem(B, H, Nq, Nk, d, causal, scale);
    p.H_kv = H_kv;
    forward(stage, dtype, p, Q, K, V, O, L, stream);
  });
}

int flashstep_stage_grouped_heads(const char* stage) {
  int grouped = -1;
  guarded([&] { grouped = find_stage(stage).grouped_heads ? 1 : 0; });
  return grouped;
}

int flashstep_backward(const char* stage, int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                       int64_t d, int causal, double scale, const float* Q, const float* K,
                       const float* V, const float* O, const float* L, const float* dO,
                       float* dQ, float* dK, float* dV, void* stream) {
  return flashstep_backward_typed(stage, FLASHSTEP_FP32, B, H, Nq, Nk, d, causal, scale, Q, K, V,
                                  O, L, dO, dQ, dK, dV, stream);
}

int flashstep_backward_typed(const char* stage, int dtype, int64_t B, int64_t H, int64_t Nq,
                             int64_t Nk, int64_t d, int causal, double scale, const void* Q,
                             const void* K, const void* V, const void* O, const float* L,
                             const void* dO, void* dQ, void* dK, void* dV, void* stream) {
  return guarded([&] {
    backward(stage, dtype, make_problem(B, H, Nq, Nk, d, causal, scale), Q, K, V, O, L, dO, dQ,
             dK, dV, stream);
  });
}

int flashstep_backward_v2(const char* stage, int dtype, int64_t B, int64_t H, int64_t H_kv,
                          int64_t Nq, int64_t Nk, int64_t d, int causal, double scale,
                          const void* Q, const void* K, const void* V, const void* O,
                          const float* L, const void* dO, void* dQ, void* dK, void* dV,
                          void* stream) {
  return guarded([&] {
    Problem p = make_problem(B, H, Nq, Nk, d, causal, scale);
    p.H_kv = H_kv;
    backward(stage, dtype, p, Q, K, V, O, L, dO, dQ, dK, dV, stream);
  });
}

int flashstep_forward_kvcache(int dtype, int64_t B, int64_t H, int64_t H_kv, int64_t Nq,
                              int64_t capacity, int64_t d, int causal, double scale, const void* Q,
                              void* K_cache, void* V_cache, const int32_t* cache_seqlens,
                              const int32_t* block_table, int64_t num_pages, int64_t pages_per_seq,
                              int64_t page_keys, const void* K_new, const void* V_new, void* O,
                              float* L, void* stream) {
  return guarded([&] {
    Problem p = make_problem(B, H, Nq, capacity, d, causal, scale);
    p.H_kv = H_kv;
    forward_kvcache(p, dtype,
                    {Q, K_cache, V_cache, cache_seqlens, block_table, num_pages, pages_per_seq,
                     page_keys, K_new, V_new, O, L},
                    stream);
  });
}

int flashstep_stage_grouped_backward(const char* stage) {
  int grouped = -1;
  guarded([&] { grouped = find_stage(stage).grouped_backward ? 1 : 0; });
  return grouped;
}

const char* flashstep_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
