// Stage 08, ablation step 4 (+ ping-pong: the two consumer warpgroups take
// turns on the tensor cores): the launcher of hopper_launch.cuh for this
// step, the stage as it stands.
//
// Run it:
//   ./build/stages/cli/flashstep --stage 08 --dtype bf16 --B 4 --H 16 --N 4096 --d 128
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kPingPong>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
