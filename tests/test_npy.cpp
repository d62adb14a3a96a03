// .npy reading and writing, and clear errors on malformed files.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/npy.h"

namespace {
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("flashstep_test_" + name)).string();
}

// The bytes of a .npy file: magic, version, header length (2 bytes for v1, 4
// for v2 and v3), `header` as given, and `data_bytes` zero bytes of data.
std::string npy_bytes(int version, const std::string& header, size_t data_bytes) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(version);
  out += '\0';
  const size_t len_bytes = version == 1 ? 2 : 4;
  for (size_t k = 0; k < len_bytes; ++k) out += static_cast<char>(header.size() >> (8 * k) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A v1 .npy file with the given header dict, padded as NumPy pads it, and
// `data_bytes` zero bytes of data.
std::string raw_npy(const std::string& name, const std::string& dict, size_t data_bytes) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  return write_file(name, npy_bytes(1, header, data_bytes));
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

TEST_CASE("npy: v2 and v3 headers read like v1") {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  for (int version : {2, 3}) {
    CAPTURE(version);
    const auto a = flashstep::read_npy(write_file("v23.npy", npy_bytes(version, dict, 24)));
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
    CHECK(a.data.size() == 6);
  }
}

TEST_CASE("npy: a header longer than np.load reads is refused before it is allocated") {
  using flashstep::Error;
  using flashstep::read_npy;
  // A 14-byte v2 file that claims a header of almost 4 GiB.
  const std::string huge = npy_bytes(2, "", 0).substr(0, 8) + std::string("\xf0\xff\xff\xff", 4);
  CHECK_THROWS_WITH_AS(read_npy(write_file("v2_huge.npy", huge + "{}")),
                       doctest::Contains("header of 4294967280 bytes; np.load reads at most 10000"),
                       Error);
  // A legal v1 header of 60000 bytes (a long descr), which a recursive regex
  // overflowed the stack on.
  const std::string long_descr =
      "{'descr': '" + std::string(60000, 'x') + "', 'fortran_order': False, 'shape': (2,), }";
  CHECK_THROWS_WITH_AS(read_npy(raw_npy("long_descr.npy", long_descr, 8)),
                       doctest::Contains("np.load reads at most 10000"), Error);
}

TEST_CASE("npy: long runs of whitespace in a header within np.load's limit are read") {
  const std::string gap(4500, ' ');
  const auto a = flashstep::read_npy(raw_npy(
      "spaces.npy", "{'descr':" + gap + "'<f4', 'fortran_order': False, 'shape': (" + gap + "2,), }",
      8));
  CHECK(a.shape == std::vector<std::int64_t>{2});
  const std::string long_descr =
      "{'descr': '" + std::string(9000, 'x') + "', 'fortran_order': False, 'shape': (2,), }";
  CHECK_THROWS_WITH_AS(flashstep::read_npy(raw_npy("long_descr_ok.npy", long_descr, 8)),
                       doctest::Contains("expected float32"), flashstep::Error);
}

TEST_CASE("npy: element counts at the 2^61 boundary: the byte count never overflows") {
  using flashstep::Error;
  using flashstep::read_npy;
  // 2^61 - 1 floats take 2^63 - 4 bytes, which int64 holds; 2^61 floats do not.
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("edge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2305843009213693951,), }", 0)),
      doctest::Contains("shape needs 9223372036854775804"), Error);
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("over.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2305843009213693952,), }", 0)),
      doctest::Contains("shape too large"), Error);
  CHECK_THROWS_WITH_AS(
      read_npy(raw_npy("digits.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0)),
      doctest::Contains("shape entry too large"), Error);
}

TEST_CASE("npy: headers NumPy would read differently, or not at all, are refused") {
  using flashstep::Error;
  using flashstep::read_npy;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1.9, 2), }", "expected ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", "expected ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 2), }", "a non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", "not a tuple"},
      {"{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "'descr' twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1, }", "unexpected key 'extra'"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", "True or False"},
      {"{'descr': '<f4', 'shape': (2,), }", "no 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", "nothing after"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", "malformed header"},
      {"", "expected '{'"},
      {"{'descr':\v'<f4', 'fortran_order': False, 'shape': (2,), }", "malformed header"},
  };
  for (const auto& [dict, message] : cases) {
    CAPTURE(dict);
    CHECK_THROWS_WITH_AS(read_npy(raw_npy("numpy_differs.npy", dict, 8)), doctest::Contains(message.c_str()),
                         Error);
  }
}

TEST_CASE("npy: a FIFO or a folder is refused, not waited on") {
  using flashstep::Error;
  const std::string fifo = temp_path("fifo.npy");
  std::remove(fifo.c_str());
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(flashstep::read_npy(fifo), doctest::Contains("not a regular file"), Error);
  const float x[1] = {1};
  CHECK_THROWS_WITH_AS(flashstep::write_npy(fifo, {1}, x), doctest::Contains("not a regular file"),
                       Error);
  std::remove(fifo.c_str());
  CHECK_THROWS_WITH_AS(flashstep::read_npy(std::filesystem::temp_directory_path().string()),
                       doctest::Contains("not a regular file"), Error);
}

TEST_CASE("npy: mutated headers are read or refused with one line, never anything else") {
  // Seeded, and bounded in time as well as in count so CI stays cheap.
  constexpr std::uint64_t kSeed = 18;
  constexpr int kMaxCases = 20000;
  constexpr double kMaxSeconds = 5.0;
  constexpr size_t kLongRun = 60000;  // past np.load's header limit, within v1's 65535
  const std::string alphabet = "{}()[],:'\" \n\t0123456789-.eLTrueFalsdcripthofn_<>f4f8";
  const std::vector<std::string> seeds = {
      npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24),
      npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n", 4),
      npy_bytes(2, "{'shape': (1, 2, 1, 1,), 'fortran_order': False, 'descr': '<f4'}\n", 8),
      npy_bytes(3, "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3,)}\n", 12),
      npy_bytes(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }\n", 12),
  };
  // The header length field: 2 bytes at byte 8 in v1, 4 in v2 and v3; the header follows.
  auto len_bytes = [](const std::string& b) { return b.size() > 6 && b[6] == 1 ? 2u : 4u; };
  auto header_len = [&](const std::string& b) {
    std::uint64_t len = 0;
    for (size_t k = 0; k < len_bytes(b) && 8 + k < b.size(); ++k) {
      len |= std::uint64_t{static_cast<unsigned char>(b[8 + k])} << (8 * k);
    }
    return len;
  };
  auto set_header_len = [&](std::string& b, std::uint64_t len) {
    for (size_t k = 0; k < len_bytes(b) && 8 + k < b.size(); ++k) {
      b[8 + k] = static_cast<char>(len >> (8 * k) & 0xff);
    }
  };
  std::mt19937_64 rng(kSeed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const std::string path = temp_path("fuzz.npy");
  const auto start = std::chrono::steady_clock::now();
  int cases = 0, read = 0;
  for (; cases < kMaxCases; ++cases) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kMaxSeconds) break;
    std::string bytes = seeds[pick(seeds.size())];
    // One kind of damage per file, so that each reaches the parser whole.
    switch (pick(4)) {
      case 0:  // a few bytes replaced, inserted or erased
        for (size_t edits = 1 + pick(4); edits > 0; --edits) {
          const size_t at = pick(bytes.size());
          switch (pick(4)) {
            case 0: bytes[at] = alphabet[pick(alphabet.size())]; break;
            case 1: bytes[at] = static_cast<char>(rng()); break;
            case 2: bytes.insert(at, 1 + pick(8), alphabet[pick(alphabet.size())]); break;
            case 3: bytes.erase(at, 1 + pick(8)); break;
          }
        }
        break;
      case 1: {  // a long run of spaces or letters after a token, the header grown to hold it
        std::vector<size_t> tokens;
        const size_t header = 8 + len_bytes(bytes);
        for (size_t k = header; k < std::min<size_t>(bytes.size(), header + header_len(bytes)); ++k) {
          if (bytes[k] != '\0' && std::strchr(":(',\"", bytes[k])) tokens.push_back(k + 1);
        }
        const size_t run = pick(2) ? kLongRun : pick(kLongRun);
        bytes.insert(tokens[pick(tokens.size())], run, pick(2) ? ' ' : 'x');
        set_header_len(bytes, header_len(bytes) + run);
        break;
      }
      case 2: set_header_len(bytes, pick(2) ? pick(bytes.size()) : rng()); break;
      case 3: bytes.resize(pick(bytes.size())); break;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      const auto a = flashstep::read_npy(path);
      std::int64_t n = 1;
      for (std::int64_t s : a.shape) n *= s;
      CHECK(static_cast<std::int64_t>(a.data.size()) == n);
      ++read;
    } catch (const flashstep::Error& e) {
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    } catch (const std::exception& e) {
      FAIL_CHECK("case " << cases << ": " << e.what());
    }
  }
  MESSAGE("npy fuzz: " << cases << " mutated files, " << read << " read, the rest refused");
  CHECK(cases > 0);
}

TEST_CASE("npy: a write the disk refuses is an error, even when it fails only at close") {
  // A file-size limit stands in for a full disk. A small array sits whole in
  // the stream's buffer until the file is closed, and fails only there.
  constexpr rlim_t kLimitBytes = 64;
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // fail the write, not the process
  rlimit small = saved;
  small.rlim_cur = kLimitBytes;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const std::vector<float> x(100, 1.0f);
  CHECK_THROWS_WITH_AS(flashstep::write_npy(temp_path("full.npy"), {100}, x.data()),
                       doctest::Contains("write failed"), flashstep::Error);
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
}
