// Stage 08, ablation step 2 (+ TMA copies on mbarriers, two K/V buffers):
// the launcher of hopper_launch.cuh for this step.
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kTmaPipeline>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
