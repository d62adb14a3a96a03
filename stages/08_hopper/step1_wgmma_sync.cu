// Stage 08, ablation step 1 (wgmma, synchronous; tiles copied in by the
// threads): the launcher of hopper_launch.cuh for this step, in a file of its
// own so that the steps compile in parallel.
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kWgmmaSync>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
