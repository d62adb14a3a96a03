// Stage 08, ablation step 3 (+ warp specialization: a producer warpgroup for
// the TMA copies, two consumer warpgroups, setmaxnreg between them): the
// launcher of hopper_launch.cuh for this step.
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kWarpSpecialized>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
