// Stage 07, ablation step 1 (plain mma.sync, fragments from plain shared memory, P~ through shared memory):
// the launcher of tensor_core_launch.cuh for this step, in a file of its own
// so that the steps compile in parallel.
#include "tensor_core_launch.cuh"

namespace flashstep::tensor_core {
template void forward<Step::kPlainMma>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::tensor_core
