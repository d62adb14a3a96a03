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

/// Reads a .npy file (version 1, 2 or 3) holding a little-endian float32
/// ('<f4') or float16 ('<f2', widened exactly to float32) C-order array.
/// Throws flashstep::Error, in one line naming the file and the problem, for
/// anything else: missing, not a regular file (a FIFO would block), not .npy,
/// a header np.load would refuse or read differently (over its 10000 bytes,
/// another key, a key twice, a shape entry that is no integer), wrong dtype,
/// Fortran order, data that does not match the shape.
NpyArray read_npy(const std::string& path);

/// Writes `data` with `shape` as a version 1.0 .npy file ('<f4', C order),
/// replacing a regular file at `path`. Throws flashstep::Error when `path` is
/// something else (a folder, a FIFO), cannot be created, or the write fails.
void write_npy(const std::string& path, const std::vector<std::int64_t>& shape,
               const float* data);

}  // namespace flashstep
