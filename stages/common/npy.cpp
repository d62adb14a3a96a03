#include "npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "error.h"
#include "rounding.h"

namespace flashstep {

namespace {
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// The .npy format pads the header so that the data starts 64-byte aligned.
constexpr size_t kHeaderAlign = 64;

// Product of the dimensions, or -1 when it would not fit in 62 bits.
std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n) || n > (std::int64_t{1} << 61)) return -1;
  }
  return n;
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(path + ": " + why);
}
}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open file");
  char magic[kMagicLen];
  if (!f.read(magic, kMagicLen) || std::memcmp(magic, kMagic, kMagicLen) != 0) {
    fail(path, "not a .npy file (bad magic)");
  }
  unsigned char version[2];
  if (!f.read(reinterpret_cast<char*>(version), 2)) fail(path, "truncated header");
  std::uint32_t header_len = 0;
  if (version[0] == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) fail(path, "truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) fail(path, "truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
  } else {
    fail(path, "unsupported .npy version " + std::to_string(version[0]));
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) fail(path, "truncated header");

  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'"))) {
    fail(path, "header has no 'descr'");
  }
  // float16 is read too, and widened exactly: bf16 inputs come as float32
  // (NumPy has no bf16) and are rounded on their way to the device.
  const bool fp16 = m[1] == "<f2";
  if (m[1] != "<f4" && !fp16) {
    fail(path, "dtype is '" + m[1].str() +
                   "', expected float32 '<f4' or float16 '<f2' (use arr.astype(np.float32))");
  }
  const std::int64_t elem_bytes = fp16 ? sizeof(std::uint16_t) : sizeof(float);
  if (!std::regex_search(header, m, std::regex("'fortran_order':\\s*(True|False)"))) {
    fail(path, "header has no 'fortran_order'");
  }
  if (m[1] == "True") fail(path, "Fortran order is not supported (use np.ascontiguousarray)");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) {
    fail(path, "header has no 'shape'");
  }
  NpyArray a;
  std::stringstream dims(m[1].str());
  std::string item;
  while (std::getline(dims, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      a.shape.push_back(std::stoll(item));
    } catch (const std::exception&) {
      fail(path, "bad shape entry '" + item + "'");
    }
    if (a.shape.back() < 0) fail(path, "negative dimension in shape");
  }
  const std::int64_t n = element_count(a.shape);
  if (n < 0) fail(path, "shape too large");
  const std::streampos data_start = f.tellg();
  f.seekg(0, std::ios::end);
  const std::int64_t data_bytes = static_cast<std::int64_t>(f.tellg() - data_start);
  f.seekg(data_start);
  if (data_bytes != n * elem_bytes) {
    fail(path, "holds " + std::to_string(data_bytes) + " data bytes, shape needs " +
                   std::to_string(n * elem_bytes));
  }
  a.data.resize(static_cast<size_t>(n));
  if (fp16) {
    std::vector<std::uint16_t> bits(static_cast<size_t>(n));
    if (!f.read(reinterpret_cast<char*>(bits.data()), n * elem_bytes)) fail(path, "read failed");
    for (size_t k = 0; k < bits.size(); ++k) a.data[k] = from_bits(DType::kFp16, bits[k]);
    return a;
  }
  if (!f.read(reinterpret_cast<char*>(a.data.data()), n * elem_bytes)) fail(path, "read failed");
  return a;
}

void write_npy(const std::string& path, const std::vector<std::int64_t>& shape,
               const float* data) {
  std::string tuple = "(";
  for (size_t k = 0; k < shape.size(); ++k) tuple += (k ? ", " : "") + std::to_string(shape[k]);
  tuple += shape.size() == 1 ? ",)" : ")";  // Python's one-element tuple needs the comma
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + tuple + ", }";
  const size_t preamble = kMagicLen + 2 + 2;
  const size_t total = preamble + dict.size() + 1;  // + '\n'
  const size_t pad = (kHeaderAlign - total % kHeaderAlign) % kHeaderAlign;
  dict.append(pad, ' ');
  dict += '\n';

  std::ofstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot create file");
  f.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  f.write(version, 2);
  const std::uint16_t len = static_cast<std::uint16_t>(dict.size());
  const char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(len_le, 2);
  f.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  f.write(reinterpret_cast<const char*>(data),
          element_count(shape) * static_cast<std::int64_t>(sizeof(float)));
  if (!f) fail(path, "write failed");
}

}  // namespace flashstep
