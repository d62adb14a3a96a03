/// \file npy.h
/// \brief Reading float32 and float16 and writing float32 NumPy .npy files (C
/// order, little-endian).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashstep {

/// An array, as float32, and its shape.
struct NpyArray {
  std::vector<std::int64_t> shape;  ///< e.g. {B, H, N, d}
  std::vector<float> data;          ///< row-major, product(shape) elements
};

/// Reads a .npy file holding a little-endian float32 ('<f4') or float16
/// ('<f2', widened exactly to float32) C-order array. Throws flashstep::Error
/// naming the file and the problem (missing, not .npy, wrong dtype, Fortran
/// order, truncated data).
NpyArray read_npy(const std::string& path);

/// Writes `data` with `shape` as a version 1.0 .npy file ('<f4', C order).
void write_npy(const std::string& path, const std::vector<std::int64_t>& shape,
               const float* data);

}  // namespace flashstep
