// Stage 08, ablation step 4 (+ ping-pong: the two consumer warpgroups take
// turns on the tensor cores): the launcher of hopper_launch.cuh for this step.
#include "hopper_launch.cuh"

namespace flashstep::hopper {
template void forward<Step::kPingPong>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::hopper
