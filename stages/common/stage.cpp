// The element types a stage runs in and the float4 check (stage.h). In
// flashstep_common, beside the runner that checks them and the stages'
// launchers that call float4_ok, rather than with the registry: a program
// that links one stage's launcher alone (a bench tool) finds them.
#include <algorithm>
#include <cstdint>
#include <string>

#include "error.h"
#include "stage.h"

namespace flashstep {

bool float4_ok(const Problem& p, const ForwardTensors& t) {
  constexpr std::int64_t kFloat4Bytes = 16;
  auto aligned = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % kFloat4Bytes == 0;
  };
  return p.d * p.elem_bytes() % kFloat4Bytes == 0 && aligned(t.Q) && aligned(t.K) &&
         aligned(t.V) && aligned(t.O);
}

bool Stage::supports(DType t) const {
  return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end();
}

bool Stage::backward_supports(DType t) const {
  return backward != nullptr &&
         std::find(backward_dtypes.begin(), backward_dtypes.end(), t) != backward_dtypes.end();
}

std::string dtype_list(const std::vector<DType>& types) {
  std::string out;
  for (DType t : types) out += (out.empty() ? "" : ", ") + std::string(dtype_name(t));
  return out;
}

void require_dtype(const Stage& stage, DType t, bool backward) {
  const std::string name(stage.name);
  if (backward && !stage.backward) throw Error("stage " + name + " has no backward pass");
  if (backward ? stage.backward_supports(t) : stage.supports(t)) return;
  throw Error("stage " + name + (backward ? "'s backward" : "") + " does not run in " +
              std::string(dtype_name(t)) + " (it runs in " +
              dtype_list(backward ? stage.backward_dtypes : stage.dtypes) + ")");
}

void require_heads(const Stage& stage, const Problem& p, bool backward) {
  if (!p.grouped() || (backward ? stage.grouped_backward : stage.grouped_heads)) return;
  throw Error("stage " + std::string(stage.name) + (backward ? "'s backward" : "") +
              " does not run grouped-query attention (H_kv = " + std::to_string(p.kv_heads()) +
              " < H = " + std::to_string(p.H) + "); " +
              (backward ? "it needs H_kv = H" : "stages that do: see flashstep --list"));
}

}  // namespace flashstep
