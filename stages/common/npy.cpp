#include "npy.h"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "error.h"
#include "rounding.h"

namespace flashstep {

namespace {
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// The .npy format pads the header so that the data starts 64-byte aligned.
constexpr size_t kHeaderAlign = 64;
// The longest header np.load reads by default (numpy.lib.format's
// _MAX_HEADER_SIZE): a float32 array's header is under 128 bytes, and a
// v2/v3 header's 4-byte length must not make the reader allocate gigabytes.
constexpr std::uint32_t kMaxHeaderBytes = 10000;
// The most elements whose byte count fits in std::int64_t.
constexpr std::int64_t kMaxElements =
    std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(sizeof(float));
// How much of a key or value a message quotes.
constexpr size_t kExcerptChars = 32;

// Product of the dimensions, or -1 when its byte count would not fit in 64 bits.
std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n) || n > kMaxElements) return -1;
  }
  return n;
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(path + ": " + why);
}

// The start of `s`, printable, for a one-line message.
std::string excerpt(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, kExcerptChars)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return s.size() > kExcerptChars ? out + "..." : out;
}

// What the header's dictionary holds.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// Parses the header: the Python literal NumPy writes,
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// with exactly these three keys, each once, in any order (NumPy refuses any
// other key), whitespace between tokens, and nothing but whitespace after.
// One pass, no recursion and no regex, so a header of any length costs time
// in proportion to it.
class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), text_(text) {}

  Header parse() {
    Header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{');
    while (!take('}')) {
      const std::string key = quoted("a key");
      expect(':');
      if (key == "descr") {
        once(seen_descr, key);
        h.descr = quoted("the descr string");
      } else if (key == "fortran_order") {
        once(seen_order, key);
        h.fortran_order = boolean();
      } else if (key == "shape") {
        once(seen_shape, key);
        h.shape = shape();
      } else {
        fail(path_, "header has an unexpected key '" + excerpt(key) +
                        "' (a .npy header holds descr, fortran_order and shape)");
      }
      if (!take(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) malformed("nothing after the closing '}'");
    if (!seen_descr) fail(path_, "header has no 'descr'");
    if (!seen_order) fail(path_, "header has no 'fortran_order'");
    if (!seen_shape) fail(path_, "header has no 'shape'");
    return h;
  }

 private:
  const std::string& path_;
  const std::string& text_;
  size_t pos_ = 0;

  [[noreturn]] void malformed(const std::string& wanted) const {
    fail(path_, "malformed header: expected " + wanted + " at byte " + std::to_string(pos_));
  }
  // Python's whitespace between tokens; unlike std::isspace, not '\v'.
  void skip_space() {
    while (pos_ < text_.size() && text_[pos_] != '\0' && std::strchr(" \t\n\r\f", text_[pos_])) ++pos_;
  }
  // Consumes `c` (after whitespace) when it comes next.
  bool take(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) malformed(std::string("'") + c + "'");
  }
  void once(bool& seen, const std::string& key) const {
    if (seen) fail(path_, "header has '" + key + "' twice");
    seen = true;
  }
  // A Python string literal in single or double quotes, without escapes.
  std::string quoted(const std::string& what) {
    skip_space();
    const char quote = pos_ < text_.size() ? text_[pos_] : '\0';
    if (quote != '\'' && quote != '"') malformed(what);
    const size_t close = text_.find(quote, pos_ + 1);
    if (close == std::string::npos) malformed("a closing quote");
    std::string s = text_.substr(pos_ + 1, close - pos_ - 1);
    pos_ = close + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, {"False", false}}) {
      if (text_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    malformed("True or False for 'fortran_order'");
  }
  // A tuple of non-negative decimal integers: (), (3,), (2, 3) or (2, 3,).
  std::vector<std::int64_t> shape() {
    std::vector<std::int64_t> dims;
    bool comma_after_last = false;
    expect('(');
    while (!take(')')) {
      skip_space();
      const size_t start = pos_;
      std::int64_t v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
          fail(path_, "shape entry too large");
        }
        ++pos_;
      }
      if (pos_ == start) malformed("a non-negative integer in 'shape'");
      dims.push_back(v);
      comma_after_last = take(',');
      if (!comma_after_last) {
        expect(')');
        break;
      }
    }
    // Python's one-element tuple needs its comma: (3) is the integer 3.
    if (dims.size() == 1 && !comma_after_last) {
      fail(path_, "shape (n) is not a tuple; a one-element shape is written (n,)");
    }
    return dims;
  }
};
}  // namespace

NpyArray read_npy(const std::string& path) {
  // open() on a FIFO or a device would block or never end: regular files only.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) fail(path, "cannot open file");
  if (!std::filesystem::is_regular_file(status)) fail(path, "not a regular file");
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
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header of " + std::to_string(header_len) + " bytes; np.load reads at most " +
                   std::to_string(kMaxHeaderBytes));
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) fail(path, "truncated header");

  NpyArray a;
  const Header h = HeaderParser(path, header).parse();
  // float16 is read too, and widened exactly: bf16 inputs come as float32
  // (NumPy has no bf16) and are rounded on their way to the device.
  const bool fp16 = h.descr == "<f2";
  if (h.descr != "<f4" && !fp16) {
    fail(path, "dtype is '" + excerpt(h.descr) +
                   "', expected float32 '<f4' or float16 '<f2' (use arr.astype(np.float32))");
  }
  if (h.fortran_order) fail(path, "Fortran order is not supported (use np.ascontiguousarray)");
  a.shape = h.shape;
  // Counted in floats, as the array is held: a float16 file's bytes are fewer.
  const std::int64_t n = element_count(a.shape);
  if (n < 0) fail(path, "shape too large");
  const std::int64_t elem_bytes = fp16 ? sizeof(std::uint16_t) : sizeof(float);
  const std::int64_t need = n * elem_bytes;
  const std::streampos data_start = f.tellg();
  f.seekg(0, std::ios::end);
  const std::int64_t data_bytes = static_cast<std::int64_t>(f.tellg() - data_start);
  f.seekg(data_start);
  if (data_bytes != need) {
    fail(path, "holds " + std::to_string(data_bytes) + " data bytes, shape needs " +
                   std::to_string(need));
  }
  a.data.resize(static_cast<size_t>(n));
  if (fp16) {
    std::vector<std::uint16_t> bits(static_cast<size_t>(n));
    if (!f.read(reinterpret_cast<char*>(bits.data()), need)) fail(path, "read failed");
    for (size_t k = 0; k < bits.size(); ++k) a.data[k] = from_bits(DType::kFp16, bits[k]);
    return a;
  }
  if (!f.read(reinterpret_cast<char*>(a.data.data()), need)) fail(path, "read failed");
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

  const std::int64_t n = element_count(shape);
  if (n < 0) fail(path, "shape too large");
  // open() on a FIFO would wait for a reader: replace regular files only.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    fail(path, "exists and is not a regular file");
  }
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot create file");
  f.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  f.write(version, 2);
  const std::uint16_t len = static_cast<std::uint16_t>(dict.size());
  const char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(len_le, 2);
  f.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  f.write(reinterpret_cast<const char*>(data), n * static_cast<std::int64_t>(sizeof(float)));
  // The last buffered bytes reach the file at close: a full disk shows there.
  f.close();
  if (!f) fail(path, "write failed");
}

}  // namespace flashstep
