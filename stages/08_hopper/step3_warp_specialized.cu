// Stage 08, ablation step 3 (+ warp specialization: a producer warpgroup for
// the TMA copies, two consumer warpgroups, setmaxnreg between them): the
// launcher of hopper_launch.cuh for this step, the stage as it stands.
//
// Run it:
//   ./build/stages/cli/flashstep --stage 08 --dtype bf16 --B 4 --H 16 --N 4096 --d 128
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kWarpSpecialized>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
