// .npy reading and writing, and clear errors on malformed files.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/npy.h"

namespace {
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("flashstep_test_" + name)).string();
}

// A .npy file with the given header dict and `data_bytes` zero bytes of data.
std::string raw_npy(const std::string& name, const std::string& dict, size_t data_bytes) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  f.write(len, 2);
  f << header << std::string(data_bytes, '\0');
  return path;
}
}  // namespace

TEST_CASE("npy: write then read gives the same shape and values") {
  const std::vector<float> data = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 7.0f};
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{6}, {2, 3}, {1, 2, 3, 1}}) {
    const std::string path = temp_path("roundtrip.npy");
    flashstep::write_npy(path, shape, data.data());
    const auto a = flashstep::read_npy(path);
    CHECK(a.shape == shape);
    CHECK(a.data == data);
  }
}

TEST_CASE("npy: the header is what NumPy writes") {
  const std::string path = temp_path("header.npy");
  const float x[3] = {1, 2, 3};
  flashstep::write_npy(path, {3}, x);
  std::ifstream f(path, std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(content.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }") != std::string::npos);
  CHECK((content.size() - 3 * 4) % 64 == 0);  // data starts 64-byte aligned
}

TEST_CASE("npy: float16 ('<f2') is read and widened exactly, its size counts 2-byte elements") {
  // 1, -2, 65504 (fp16's largest), 2^-24 (its smallest subnormal), -0, +inf.
  const std::vector<std::uint16_t> bits = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00};
  const std::string data(reinterpret_cast<const char*>(bits.data()), bits.size() * 2);
  const std::string path =
      raw_npy("f2.npy", "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", 0);
  std::ofstream(path, std::ios::binary | std::ios::app) << data;
  const auto a = flashstep::read_npy(path);
  CHECK(a.shape == std::vector<std::int64_t>{2, 3});
  REQUIRE(a.data.size() == 6);
  CHECK(a.data[0] == 1.0f);
  CHECK(a.data[1] == -2.0f);
  CHECK(a.data[2] == 65504.0f);
  CHECK(a.data[3] == std::ldexp(1.0f, -24));
  CHECK((a.data[4] == 0.0f && std::signbit(a.data[4])));
  CHECK(std::isinf(a.data[5]));
  const std::string short_path =
      raw_npy("f2short.npy", "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", 6);
  CHECK_THROWS_WITH_AS(flashstep::read_npy(short_path), doctest::Contains("shape needs 8"),
                       flashstep::Error);
  const std::string big_endian =
      raw_npy("f2big.npy", "{'descr': '>f2', 'fortran_order': False, 'shape': (1,), }", 2);
  CHECK_THROWS_WITH_AS(flashstep::read_npy(big_endian),
                       doctest::Contains("expected float32 '<f4' or float16 '<f2'"),
                       flashstep::Error);
}

TEST_CASE("npy: malformed files give one clear error naming the file") {
  using flashstep::Error;
  using flashstep::read_npy;
  CHECK_THROWS_WITH_AS(read_npy(temp_path("missing.npy")),
                       doctest::Contains("cannot open file"), Error);
  {
    std::ofstream(temp_path("text.npy")) << "hello, not numpy";
    CHECK_THROWS_WITH_AS(read_npy(temp_path("text.npy")), doctest::Contains("bad magic"), Error);
  }
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16)),
      doctest::Contains("expected float32"), Error);
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8)),
      doctest::Contains("Fortran order"), Error);
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 8)),
      doctest::Contains("shape needs 16"), Error);
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("long.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8)),
      doctest::Contains("shape needs 4"), Error);
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("huge.npy",
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", 8)),
      doctest::Contains("too large"), Error);
}
