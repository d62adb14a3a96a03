// Stage 07, ablation step 3 (+ cp.async, loads under compute):
// the launcher of tensor_core_launch.cuh for this step, in a file of its own
// so that the steps compile in parallel.
#include "tensor_core_launch.cuh"

namespace flashstep::tensor_core {
template void forward<Step::kCpAsync>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::tensor_core
