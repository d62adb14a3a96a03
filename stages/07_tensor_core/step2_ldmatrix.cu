// Stage 07, ablation step 2 (+ ldmatrix and the swizzled layout):
// the launcher of tensor_core_launch.cuh for this step, in a file of its own
// so that the steps compile in parallel.
#include "tensor_core_launch.cuh"

namespace flashstep::tensor_core {
template void forward<Step::kLdmatrix>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::tensor_core
