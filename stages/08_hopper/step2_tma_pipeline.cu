// Stage 08, ablation step 2 (+ TMA copies on mbarriers, two K/V buffers):
// the launcher of hopper_launch.cuh for this step.
//
// Run it:
//   ./build/stages/cli/flashstep --stage 08 --dtype bf16 --B 4 --H 16 --N 4096 --d 128
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kTmaPipeline>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
