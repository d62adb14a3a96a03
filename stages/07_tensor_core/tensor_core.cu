// Stage 07: FlashAttention-2's forward on tensor cores (Dao 2023, Algorithm 1,
// §3.1-3.3), bf16 or fp16 in and out, fp32 accumulators: the kernel
// FlashAttention-2 ships, written plainly.
//
// What changed since stage 06: the arithmetic moved from the CUDA cores'
// fp32 FMAs to the tensor cores' mma.sync.m16n8k16, which multiplies 16-bit
// matrices into fp32 about 15 times as fast on an H100/H200. Everything
// around it is the previous stages' lessons: Q blocks over thread blocks
// (05), warps owning whole rows of Q (06), the online softmax with one
// division at the end (04). What is new is how to feed the tensor cores:
// fragments in the layout the instruction wants (ldmatrix from a swizzled
// shared-memory layout), tiles that arrive while the previous ones compute
// (cp.async), and P~ that never leaves the registers. tensor_core.cuh holds
// the kernel; tensor_core_tiles.h the ablation steps and tile shapes; each
// step_*.cu builds one step of the ladder, and this file the last: all ideas
// on, tiles tuned per head dimension.
//
// Run it:
//   ./build/stages/cli/flashstep --stage 07 --B 4 --H 16 --N 4096 --d 128
// (--stage 07 runs the whole ladder; --stage 07_tensor_core the stage alone.)
#include "tensor_core_launch.cuh"

namespace flashstep::tensor_core {
template void forward<Step::kTunedTiles>(const Problem&, const ForwardTensors&, Stream);
}  // namespace flashstep::tensor_core
