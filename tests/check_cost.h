/// \file check_cost.h
/// \brief Checks a CPU mirror's counts against a model, field by field, so a
/// failure names the field that differs (Cost's == would only say "not equal").
#pragma once

#include <doctest/doctest.h>

#include "common/cost.h"

namespace flashstep::test {

inline void check_counts_equal(const Cost& counted, const Cost& model) {
  CHECK(counted.hbm_read_bytes == model.hbm_read_bytes);
  CHECK(counted.hbm_write_bytes == model.hbm_write_bytes);
  CHECK(counted.sram_read_bytes == model.sram_read_bytes);
  CHECK(counted.sram_write_bytes == model.sram_write_bytes);
  CHECK(counted.matmul_flops == model.matmul_flops);
  CHECK(counted.nonmatmul_flops == model.nonmatmul_flops);
  CHECK(counted.thread_blocks == model.thread_blocks);
  CHECK(counted.skipped_tiles == model.skipped_tiles);
  CHECK(counted.barriers == model.barriers);
  CHECK(counted.mask_tests == model.mask_tests);
}

}  // namespace flashstep::test
