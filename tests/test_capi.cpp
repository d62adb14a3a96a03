// The C ABI (libflashstep.so): the registry it exposes, and every argument
// check its forward and backward make before touching the GPU. These run
// without a CUDA driver: a check made after a CUDA call would return
// FLASHSTEP_ECUDA there instead.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/stage.h"
#include "flashstep.h"

namespace {

// A small valid problem and host buffers of the right sizes for it.
constexpr std::int64_t kB = 2, kH = 3, kNq = 17, kNk = 29, kD = 40;

struct Buffers {
  std::vector<float> Q = std::vector<float>(kB * kH * kNq * kD);
  std::vector<float> K = std::vector<float>(kB * kH * kNk * kD);
  std::vector<float> V = std::vector<float>(kB * kH * kNk * kD);
  std::vector<float> O = std::vector<float>(kB * kH * kNq * kD);
  std::vector<float> L = std::vector<float>(kB * kH * kNq);
};

// One call's arguments, each overridable by a test.
struct Call {
  Buffers buf;
  const char* stage = "05_sequence_parallel";
  std::int64_t B = kB, H = kH, Nq = kNq, Nk = kNk, d = kD;
  int causal = 0;
  double scale = 0.0;
  const float* Q = buf.Q.data();
  const float* K = buf.K.data();
  const float* V = buf.V.data();
  float* O = buf.O.data();
  float* L = buf.L.data();

  int run() const {
    return flashstep_forward(stage, B, H, Nq, Nk, d, causal, scale, Q, K, V, O, L, nullptr);
  }
};

// The backward's extra buffers, beside the forward's.
struct BackwardBuffers {
  std::vector<float> dO = std::vector<float>(kB * kH * kNq * kD);
  std::vector<float> dQ = std::vector<float>(kB * kH * kNq * kD);
  std::vector<float> dK = std::vector<float>(kB * kH * kNk * kD);
  std::vector<float> dV = std::vector<float>(kB * kH * kNk * kD);
};

// One backward call's arguments, each overridable by a test.
struct BackwardCall : Call {
  BackwardBuffers grad;
  const float* O_in = buf.O.data();
  const float* L_in = buf.L.data();
  const float* dO = grad.dO.data();
  float* dQ = grad.dQ.data();
  float* dK = grad.dK.data();
  float* dV = grad.dV.data();

  int run() const {
    return flashstep_backward(stage, B, H, Nq, Nk, d, causal, scale, Q, K, V, O_in, L_in, dO,
                              dQ, dK, dV, nullptr);
  }
};

std::string last_error() { return flashstep_last_error(); }

template <typename T>
T* shifted(T* ptr, std::ptrdiff_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(ptr) + bytes);
}

}  // namespace

TEST_CASE("capi: stage count, names and titles are the registry's") {
  const auto& stages = flashstep::all_stages();
  REQUIRE(flashstep_stage_count() == static_cast<int>(stages.size()));
  for (int i = 0; i < flashstep_stage_count(); ++i) {
    CAPTURE(i);
    REQUIRE(flashstep_stage_name(i) != nullptr);
    CHECK(std::string(flashstep_stage_name(i)) == stages[static_cast<size_t>(i)].name);
    CHECK(std::string(flashstep_stage_title(i)) == stages[static_cast<size_t>(i)].title);
    CHECK(flashstep_stage_writes_lse(flashstep_stage_name(i)) ==
          (stages[static_cast<size_t>(i)].writes_lse ? 1 : 0));
  }
  CHECK(flashstep_stage_name(-1) == nullptr);
  CHECK(flashstep_stage_name(flashstep_stage_count()) == nullptr);
  CHECK(flashstep_stage_title(flashstep_stage_count()) == nullptr);
  CHECK(flashstep_stage_writes_lse("no_such_stage") == -1);
  CHECK(last_error().find("unknown stage 'no_such_stage'") != std::string::npos);
}

TEST_CASE("capi: an unknown or ambiguous stage is FLASHSTEP_ESTAGE") {
  Call c;
  c.stage = "99_nope";
  CHECK(c.run() == FLASHSTEP_ESTAGE);
  CHECK(last_error().rfind("unknown stage '99_nope' (known: 01_naive", 0) == 0);
  c.stage = "all";
  CHECK(c.run() == FLASHSTEP_ESTAGE);
  CHECK(last_error().find("name exactly one") != std::string::npos);
  c.stage = nullptr;
  CHECK(c.run() == FLASHSTEP_EINVAL);
  CHECK(last_error() == "stage is NULL");
}

TEST_CASE("capi: an invalid problem is FLASHSTEP_EINVAL, named as validate names it") {
  Call c;
  SUBCASE("d > 256") {
    c.d = 300;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "d must be <= 256, got 300");
  }
  SUBCASE("Nq = 0") {
    c.Nq = 0;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "Nq must be >= 1, got 0");
  }
  SUBCASE("B < 0") {
    c.B = -1;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "B must be >= 1, got -1");
  }
  SUBCASE("Nk beyond 32 bits") {
    c.Nk = 3'000'000'000;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("Nk must be <= 2147483647", 0) == 0);
  }
  SUBCASE("infinite scale") {
    c.scale = std::numeric_limits<double>::infinity();
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("scale must be finite", 0) == 0);
  }
  SUBCASE("a scale beyond fp32's range, which the kernels would turn into inf") {
    c.scale = 1e39;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("scale must be finite in fp32", 0) == 0);
  }
  SUBCASE("a problem beyond what the models count") {
    c.Nq = c.Nk = 1 << 30;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("problem too large", 0) == 0);
  }
  SUBCASE("a number that selects a stage works as a name") {
    c.stage = "5";
    c.d = 257;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "d must be <= 256, got 257");
  }
}

TEST_CASE("capi: null, misaligned and overlapping pointers are FLASHSTEP_EINVAL") {
  Call c;
  SUBCASE("null Q") {
    c.Q = nullptr;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "Q is NULL");
  }
  SUBCASE("null O") {
    c.O = nullptr;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "O is NULL");
  }
  SUBCASE("misaligned K") {
    c.K = shifted(c.K, 2);
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("K (", 0) == 0);
    CHECK(last_error().find("is not aligned to 4 bytes") != std::string::npos);
  }
  SUBCASE("misaligned L") {
    c.L = shifted(c.L, 1);
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("L (", 0) == 0);
  }
  SUBCASE("O on top of Q") {
    c.O = c.buf.Q.data();
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "O overlaps Q; outputs need memory of their own");
  }
  SUBCASE("L inside O") {
    c.L = c.buf.O.data() + 5;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "L overlaps O; outputs need memory of their own");
  }
}

TEST_CASE("capi: L may be NULL only for a stage that writes none") {
  Call c;
  c.L = nullptr;
  c.stage = "02_safe_softmax";
  CHECK(c.run() == FLASHSTEP_EINVAL);
  CHECK(last_error() ==
        "L is NULL but stage 02_safe_softmax writes L [B,H,Nq]; pass a buffer of B*H*Nq floats");
  // Stage 01 writes no L: the call gets past every host-side check and fails
  // only on the host buffers (no driver here, or not device memory on a GPU).
  c.stage = "01_naive";
  c.L = shifted(c.buf.L.data(), 1);  // not even looked at
  const int code = c.run();
  CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
  CHECK(last_error().find("L ") != 0);
}

TEST_CASE("capi: valid arguments on host memory fail cleanly, with or without a GPU") {
  Call c;
  const int code = c.run();
  CHECK(code != FLASHSTEP_OK);
  CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
  CHECK_FALSE(last_error().empty());
  if (code == FLASHSTEP_EINVAL) {
    CHECK(last_error().find("must be device or managed memory") != std::string::npos);
  }
}

TEST_CASE("capi: the last error belongs to the thread that made the call") {
  Call c;
  c.d = 300;
  REQUIRE(c.run() == FLASHSTEP_EINVAL);
  std::string other;
  std::thread worker([&] {
    Call w;
    w.Q = nullptr;
    CHECK(w.run() == FLASHSTEP_EINVAL);
    other = flashstep_last_error();
  });
  worker.join();
  CHECK(other == "Q is NULL");
  CHECK(last_error() == "d must be <= 256, got 300");
  // A call that succeeds clears it.
  CHECK(flashstep_stage_count() > 0);
  CHECK(last_error().empty());
}

TEST_CASE("capi: has_backward is the registry's, -1 for an unknown stage") {
  const auto& stages = flashstep::all_stages();
  int with_backward = 0;
  for (int i = 0; i < flashstep_stage_count(); ++i) {
    CAPTURE(i);
    const bool has = stages[static_cast<size_t>(i)].backward != nullptr;
    with_backward += has;
    CHECK(flashstep_stage_has_backward(flashstep_stage_name(i)) == (has ? 1 : 0));
    CHECK(last_error().empty());
  }
  CHECK(with_backward >= 2);
  CHECK(flashstep_stage_has_backward("02_safe_softmax") == 1);
  CHECK(flashstep_stage_has_backward("5") == 1);
  CHECK(flashstep_stage_has_backward("01_naive") == 0);
  CHECK(flashstep_stage_has_backward("no_such_stage") == -1);
  CHECK(last_error().find("unknown stage 'no_such_stage'") != std::string::npos);
  CHECK(flashstep_stage_has_backward(nullptr) == -1);
  CHECK(last_error() == "stage is NULL");
}

TEST_CASE("capi backward: an unknown stage, or one without a backward, is FLASHSTEP_ESTAGE") {
  BackwardCall c;
  c.stage = "99_nope";
  CHECK(c.run() == FLASHSTEP_ESTAGE);
  CHECK(last_error().rfind("unknown stage '99_nope' (known: 01_naive", 0) == 0);
  c.stage = "all";
  CHECK(c.run() == FLASHSTEP_ESTAGE);
  CHECK(last_error().find("name exactly one") != std::string::npos);
  c.stage = nullptr;
  CHECK(c.run() == FLASHSTEP_EINVAL);
  CHECK(last_error() == "stage is NULL");
  // Refused before anything else is looked at: here d is invalid too.
  c.d = 300;
  for (const flashstep::Stage& s : flashstep::all_stages()) {
    if (s.backward) continue;
    const std::string name(s.name);
    CAPTURE(name);
    c.stage = name.c_str();
    CHECK(c.run() == FLASHSTEP_ESTAGE);
    CHECK(last_error().rfind("stage " + name + " has no backward pass; stages with one: ", 0) == 0);
    CHECK(last_error().find("02_safe_softmax") != std::string::npos);
    CHECK(last_error().find("05_sequence_parallel") != std::string::npos);
  }
}

TEST_CASE("capi backward: an invalid problem is FLASHSTEP_EINVAL, named as validate names it") {
  BackwardCall c;
  SUBCASE("d > 256") {
    c.d = 300;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "d must be <= 256, got 300");
  }
  SUBCASE("Nk = 0, stage 02") {
    c.stage = "02_safe_softmax";
    c.Nk = 0;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "Nk must be >= 1, got 0");
  }
  SUBCASE("H < 0") {
    c.H = -2;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "H must be >= 1, got -2");
  }
  SUBCASE("infinite scale") {
    c.scale = std::numeric_limits<double>::infinity();
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("scale must be finite", 0) == 0);
  }
  SUBCASE("a scale beyond fp32's range, which the kernels would turn into inf") {
    c.scale = 1e39;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("scale must be finite in fp32", 0) == 0);
  }
  SUBCASE("a problem beyond what the models count") {
    c.Nq = c.Nk = 1 << 30;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind("problem too large", 0) == 0);
  }
}

namespace {

// The stages with a backward: every argument check is theirs alike.
constexpr const char* kBackwardStages[] = {"02_safe_softmax", "05_sequence_parallel"};

// Runs `c` as each stage with a backward; each must refuse it with EINVAL and
// a message that starts with `prefix`.
void check_refused(BackwardCall& c, const std::string& prefix) {
  for (const char* stage : kBackwardStages) {
    CAPTURE(stage);
    c.stage = stage;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().rfind(prefix, 0) == 0);
  }
}

}  // namespace

TEST_CASE("capi backward: null, misaligned and overlapping pointers are FLASHSTEP_EINVAL") {
  BackwardCall c;
  SUBCASE("null L: every backward reads it") {
    c.L_in = nullptr;
    check_refused(c, "L is NULL");
  }
  SUBCASE("null O") {
    c.O_in = nullptr;
    check_refused(c, "O is NULL");
  }
  SUBCASE("null dO") {
    c.dO = nullptr;
    check_refused(c, "dO is NULL");
  }
  SUBCASE("null dV") {
    c.dV = nullptr;
    check_refused(c, "dV is NULL");
  }
  SUBCASE("misaligned dO") {
    c.dO = shifted(c.dO, 2);
    check_refused(c, "dO (");
    CHECK(last_error().find("is not aligned to 4 bytes") != std::string::npos);
  }
  SUBCASE("misaligned dK") {
    c.dK = shifted(c.dK, 1);
    check_refused(c, "dK (");
  }
  SUBCASE("dQ on top of dO") {
    c.dQ = c.grad.dO.data();
    check_refused(c, "dQ overlaps dO; outputs need memory of their own");
  }
  SUBCASE("dQ on top of Q, as an in-place gradient would be") {
    c.dQ = c.buf.Q.data();
    check_refused(c, "dQ overlaps Q; outputs need memory of their own");
  }
  SUBCASE("dK's last float is L's first") {
    const size_t kv = c.grad.dK.size();
    std::vector<float> arena(kv - 1 + c.buf.L.size());
    c.dK = arena.data();
    c.L_in = arena.data() + kv - 1;
    check_refused(c, "dK overlaps L; outputs need memory of their own");
  }
  SUBCASE("dV inside dK") {
    c.dV = c.grad.dK.data() + 7;
    check_refused(c, "dV overlaps dK; outputs need memory of their own");
  }
  SUBCASE("inputs may share memory") {
    c.Nk = c.Nq;
    c.K = c.Q;
    c.V = c.Q;
    c.dO = c.O_in;
    for (const char* stage : kBackwardStages) {
      CAPTURE(stage);
      c.stage = stage;
      const int code = c.run();
      CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
      CHECK(last_error().find("overlaps") == std::string::npos);
    }
  }
}

TEST_CASE("capi backward: valid arguments on host memory fail cleanly, with or without a GPU") {
  BackwardCall c;
  for (const char* stage : kBackwardStages) {
    CAPTURE(stage);
    c.stage = stage;
    const int code = c.run();
    CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
    CHECK_FALSE(last_error().empty());
    if (code == FLASHSTEP_EINVAL) {
      CHECK(last_error().find("must be device or managed memory") != std::string::npos);
    }
  }
}

namespace {

// One flashstep_forward_typed call on 16-bit host buffers, each argument overridable.
struct TypedCall {
  std::vector<std::uint16_t> Qb = std::vector<std::uint16_t>(kB * kH * kNq * kD);
  std::vector<std::uint16_t> KVb = std::vector<std::uint16_t>(2 * kB * kH * kNk * kD);
  std::vector<std::uint16_t> Ob = std::vector<std::uint16_t>(kB * kH * kNq * kD);
  std::vector<float> Lb = std::vector<float>(kB * kH * kNq);
  const char* stage = "02_safe_softmax";
  int dtype = FLASHSTEP_BF16;
  const void* Q = Qb.data();
  const void* K = KVb.data();
  const void* V = KVb.data() + kB * kH * kNk * kD;
  void* O = Ob.data();
  float* L = Lb.data();

  int run() const {
    return flashstep_forward_typed(stage, dtype, kB, kH, kNq, kNk, kD, 0, 0.0, Q, K, V, O, L,
                                   nullptr);
  }
};

}  // namespace

TEST_CASE("capi: each stage's element types, as flashstep_dtype bits") {
  const auto& stages = flashstep::all_stages();
  for (int i = 0; i < flashstep_stage_count(); ++i) {
    const flashstep::Stage& s = stages[static_cast<size_t>(i)];
    CAPTURE(s.name);
    const int bits = flashstep_stage_dtypes(flashstep_stage_name(i));
    CHECK(((bits >> FLASHSTEP_FP32) & 1) == (s.supports(flashstep::DType::kFp32) ? 1 : 0));
    CHECK(((bits >> FLASHSTEP_FP16) & 1) == (s.supports(flashstep::DType::kFp16) ? 1 : 0));
    CHECK(((bits >> FLASHSTEP_BF16) & 1) == (s.supports(flashstep::DType::kBf16) ? 1 : 0));
  }
  const int all = (1 << FLASHSTEP_FP32) | (1 << FLASHSTEP_FP16) | (1 << FLASHSTEP_BF16);
  CHECK(flashstep_stage_dtypes("02") == all);
  CHECK(flashstep_stage_dtypes("01") == 1 << FLASHSTEP_FP32);
  CHECK(flashstep_stage_backward_dtypes("02") == 1 << FLASHSTEP_FP32);
  CHECK(flashstep_stage_backward_dtypes("01") == 0);  // no backward
  CHECK(flashstep_stage_backward_dtypes("07_tensor_core") ==
        ((1 << FLASHSTEP_FP16) | (1 << FLASHSTEP_BF16)));
  CHECK(flashstep_stage_dtypes("no_such_stage") == -1);
  CHECK(flashstep_stage_backward_dtypes("no_such_stage") == -1);
  CHECK(last_error().find("unknown stage 'no_such_stage'") != std::string::npos);
}

TEST_CASE("capi typed: an unknown dtype is EINVAL, a type the stage lacks ESTAGE naming its types") {
  TypedCall c;
  c.dtype = 7;
  CHECK(c.run() == FLASHSTEP_EINVAL);
  CHECK(last_error() ==
        "dtype must be FLASHSTEP_FP32 (0), FLASHSTEP_FP16 (1) or FLASHSTEP_BF16 (2), got 7");
  c.dtype = FLASHSTEP_BF16;
  c.stage = "04";
  CHECK(c.run() == FLASHSTEP_ESTAGE);
  CHECK(last_error() == "stage 04_fa2_q_outer does not run in bf16 (it runs in fp32)");
  c.stage = "99_nope";  // the name is checked first
  CHECK(c.run() == FLASHSTEP_ESTAGE);
  CHECK(last_error().find("unknown stage '99_nope'") != std::string::npos);
}

TEST_CASE("capi typed: 16-bit tensors are aligned to 2 bytes and sized at 2 bytes an element") {
  TypedCall c;
  SUBCASE("an odd address is misaligned") {
    c.K = shifted(c.KVb.data(), 1);
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("K (") == 0);
    CHECK(last_error().find("is not aligned to 2 bytes (one bf16 element)") != std::string::npos);
  }
  SUBCASE("2-byte aligned is enough") {
    c.dtype = FLASHSTEP_FP16;
    c.Q = shifted(c.Qb.data(), 2);  // 4-byte misaligned, 2-byte aligned: reaches the CUDA checks
    const int code = c.run();
    CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
    CHECK(last_error().find("aligned") == std::string::npos);
  }
  SUBCASE("O right after Q: apart at 2 bytes an element (at 4 they would overlap)") {
    std::vector<std::uint16_t> both(2 * kB * kH * kNq * kD);
    c.Q = both.data();
    c.O = both.data() + kB * kH * kNq * kD;
    const int code = c.run();
    CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
    CHECK(last_error().find("overlaps") == std::string::npos);
    c.O = both.data() + kB * kH * kNq * kD - 1;  // one element into Q
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "O overlaps Q; outputs need memory of their own");
  }
  SUBCASE("L is fp32 in every type: 4-byte aligned") {
    c.L = shifted(c.Lb.data(), 2);
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("is not aligned to 4 bytes (one float)") != std::string::npos);
  }
}

TEST_CASE("capi typed backward: a type the stage's backward does not run in is ESTAGE") {
  BackwardCall c;
  auto run_typed = [&](const char* stage, int dtype) {
    return flashstep_backward_typed(stage, dtype, c.B, c.H, c.Nq, c.Nk, c.d, 0, 0.0, c.Q, c.K,
                                    c.V, c.O_in, c.L_in, c.dO, c.dQ, c.dK, c.dV, nullptr);
  };
  CHECK(run_typed("02", FLASHSTEP_BF16) == FLASHSTEP_ESTAGE);
  CHECK(last_error() == "stage 02_safe_softmax's backward does not run in bf16 (it runs in fp32)");
  CHECK(run_typed("07_tensor_core", FLASHSTEP_FP32) == FLASHSTEP_ESTAGE);
  CHECK(last_error() ==
        "stage 07_tensor_core's backward does not run in fp32 (it runs in bf16, fp16)");
  CHECK(run_typed("04", FLASHSTEP_FP32) == FLASHSTEP_ESTAGE);
  CHECK(last_error().find("has no backward pass") != std::string::npos);
  CHECK(run_typed("05", -1) == FLASHSTEP_EINVAL);
  CHECK(last_error().find("got -1") != std::string::npos);
  const int code = run_typed("05", FLASHSTEP_FP32);  // as flashstep_backward
  CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
}

namespace {

// One flashstep_forward_kvcache call on host buffers, each argument
// overridable: B = 2 sequences, H = 4, H_kv = 2, Nq = 3, a capacity of 128
// keys, d = 40; paged with `paged` (2 pages of 64 keys a sequence, a pool of 5).
struct KvCacheCall {
  static constexpr std::int64_t B = 2, H = 4, H_kv = 2, Nq = 3, capacity = 128, d = 40;
  static constexpr std::int64_t page_keys = 64, pages_per_seq = 2, pool = 5;
  std::vector<float> Q = std::vector<float>(B * H * Nq * d);
  std::vector<float> K = std::vector<float>(pool * H_kv * page_keys * d);
  std::vector<float> V = std::vector<float>(pool * H_kv * page_keys * d);
  std::vector<std::int32_t> lens = std::vector<std::int32_t>(B, 7);
  std::vector<std::int32_t> table = {0, 3, 2, 1};
  std::vector<float> K_new = std::vector<float>(B * H_kv * Nq * d);
  std::vector<float> V_new = std::vector<float>(B * H_kv * Nq * d);
  std::vector<float> O = std::vector<float>(B * H * Nq * d);
  std::vector<float> L = std::vector<float>(B * H * Nq);
  int dtype = FLASHSTEP_FP32;
  std::int64_t cap = capacity, num_pages = pool, per_seq = pages_per_seq, keys = page_keys;
  const void* q = Q.data();
  const std::int32_t* seqlens = lens.data();
  const std::int32_t* block_table = table.data();
  const void* k_new = K_new.data();
  const void* v_new = V_new.data();
  void* o = O.data();
  int run() {
    return flashstep_forward_kvcache(dtype, B, H, H_kv, Nq, cap, d, 1, 0.0, q, K.data(), V.data(),
                                     seqlens, block_table, num_pages, per_seq, keys, k_new, v_new,
                                     o, L.data(), nullptr);
  }
};

}  // namespace

TEST_CASE("capi KV cache: each argument the host can check is one FLASHSTEP_EINVAL line") {
  KvCacheCall c;
  SUBCASE("an unknown dtype") {
    c.dtype = 7;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("dtype must be") == 0);
  }
  SUBCASE("an invalid problem: capacity 0") {
    c.cap = 0;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("Nk") != std::string::npos);
  }
  SUBCASE("pages of 32 keys") {
    c.keys = 32;
    c.per_seq = 4;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("page_keys 32 must be a positive multiple of 64") != std::string::npos);
  }
  SUBCASE("pages that do not make the capacity") {
    c.per_seq = 3;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("must be the capacity Nk 128") != std::string::npos);
  }
  SUBCASE("no pool with a block table, or a pool without one") {
    c.num_pages = 0;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "num_pages must be >= 1 with a block table, got 0");
    c.block_table = nullptr;
    c.num_pages = 5;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "num_pages without a block table");
  }
  SUBCASE("a pool too large to count in bytes") {
    c.num_pages = std::numeric_limits<std::int64_t>::max() / 2;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("more bytes than 64 bits count") != std::string::npos);
  }
  SUBCASE("K_new without V_new") {
    c.v_new = nullptr;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("K_new and V_new go together") != std::string::npos);
  }
  SUBCASE("null Q, null seqlens") {
    c.q = nullptr;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "Q is NULL");
    c.q = c.Q.data();
    c.seqlens = nullptr;
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("null cache_seqlens") != std::string::npos);
  }
  SUBCASE("misaligned seqlens") {
    c.seqlens = shifted(c.lens.data(), 2);
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error().find("cache_seqlens (") == 0);
    CHECK(last_error().find("is not aligned to 4 bytes (one int32)") != std::string::npos);
  }
  SUBCASE("O on top of Q; the cache on top of K_new when appending") {
    c.o = c.Q.data();
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "O overlaps Q; outputs need memory of their own");
    c.o = c.O.data();
    c.k_new = c.K.data();
    CHECK(c.run() == FLASHSTEP_EINVAL);
    CHECK(last_error() == "K_cache overlaps K_new; outputs need memory of their own");
  }
}

TEST_CASE("capi KV cache: valid arguments on host memory fail cleanly, with or without a GPU") {
  KvCacheCall c;
  for (bool paged : {true, false}) {
    CAPTURE(paged);
    if (!paged) {  // contiguous: [B, H_kv, capacity, d] fits in the pool's buffers
      c.block_table = nullptr;
      c.num_pages = c.per_seq = c.keys = 0;
    }
    const int code = c.run();
    CHECK((code == FLASHSTEP_ECUDA || code == FLASHSTEP_EINVAL));
    CHECK_FALSE(last_error().empty());
    if (code == FLASHSTEP_EINVAL) {
      CHECK(last_error().find("must be device or managed memory") != std::string::npos);
    }
  }
}
