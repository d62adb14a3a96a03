// The D kernel's closed-form model (row_dot.cu), host-only.
#include <algorithm>

#include "row_dot.h"

namespace flashstep {

Cost row_dot_cost(const Problem& p) {
  const std::int64_t rows = p.heads() * p.Nq;
  Cost c;
  c.hbm_read_bytes = 2 * p.q_elems() * p.elem_bytes();  // dO and O
  c.hbm_write_bytes = rows * kFloatBytes;               // D
  c.nonmatmul_flops = 2 * p.q_elems();              // a multiply and an add per element
  c.thread_blocks = std::min((rows + kRowDotRowsPerBlock - 1) / kRowDotRowsPerBlock, kRowDotMaxBlocks);
  return c;
}

}  // namespace flashstep
