/// \file error.h
/// \brief The one exception type flashstep's host code throws.
#pragma once

#include <stdexcept>
#include <string>

namespace flashstep {

/// Every failure a user can cause or meet (bad sizes, a malformed .npy file,
/// a CUDA error, a problem too large for the device) is an Error whose
/// message names what was wrong in one line.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace flashstep
