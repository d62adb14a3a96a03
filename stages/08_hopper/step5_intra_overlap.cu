// Stage 08, ablation step 5 (+ the softmax of one tile under the next tile's
// products, inside each consumer warpgroup): the launcher of
// hopper_launch.cuh for this step, the stage itself: every idea of
// FlashAttention-3's forward but FP8.
//
// Run it:
//   ./build/stages/cli/flashstep --stage 08 --dtype bf16 --B 4 --H 16 --N 4096 --d 128
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kIntraOverlap>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
