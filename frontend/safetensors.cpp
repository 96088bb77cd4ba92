// The safetensors format: the checked reader, the writer, and the float conversions of its dtypes.
#include "frontend/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <system_error>

#include <nlohmann/json.hpp>

#include "frontend/atomic_file.h"

namespace pa::safetensors {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100000000;  // the reference implementation's limit
// A valid header nests three deep (object, entry, shape list). The limit stops a hostile file
// from making the first pass keep a frame for each of millions of nested objects; serde_json,
// the reference's parser, stops at 128.
constexpr int kMaxDepth = 64;

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                                DType::F8_E5M2, DType::I64, DType::I32, DType::I16, DType::I8,
                                DType::U64, DType::U32, DType::U16, DType::U8, DType::Bool};

std::string validDTypes() {
  std::string s;
  for (DType t : kAllDTypes) s += std::string(s.empty() ? "" : ", ") + dtypeName(t);
  return s;
}

// Text from a file goes into messages: keep it printable (bytes outside ASCII as \xNN) and of
// sane length.
std::string printable(const std::string& s, size_t maxShown) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < maxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > maxShown) out += "...";
  return out;
}

std::string shown(const std::string& s) { return "'" + printable(s, 200) + "'"; }

// A JSON value as a message shows it: scalars by value, containers by kind.
std::string describe(const nlohmann::json& j) {
  switch (j.type()) {
  case nlohmann::json::value_t::string: return "the string " + shown(j.get<std::string>());
  case nlohmann::json::value_t::array: return "a list";
  case nlohmann::json::value_t::object: return "an object";
  // Only a literal with a minus sign parses as number_integer, so a zero there was "-0".
  case nlohmann::json::value_t::number_integer: return j.get<int64_t>() == 0 ? "-0" : j.dump();
  case nlohmann::json::value_t::null:
  case nlohmann::json::value_t::boolean:
  case nlohmann::json::value_t::number_unsigned:
  case nlohmann::json::value_t::number_float: return j.dump();
  case nlohmann::json::value_t::binary: return "binary data";
  case nlohmann::json::value_t::discarded: return "nothing";
  }
  return "a value";
}

// A JSON integer without a sign. As in the reference implementation, "-0" and integral floats
// ("4.0", "4e0") are not.
bool nonNegativeInteger(const nlohmann::json& j, uint64_t& out) {
  if (!j.is_number_unsigned()) return false;
  out = j.get<uint64_t>();
  return true;
}

// numel * dtype size, or false when the element count overflows int64 or the byte count
// size_t. The product is checked factor by factor, as the reference implementation does, so
// [2^62, 2^62, 0] is an overflow although it holds nothing.
bool byteCount(const std::vector<int64_t>& shape, DType dtype, int64_t& numel, size_t& bytes) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  size_t b = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n), dtypeSize(dtype), &b)) return false;
  numel = n;
  bytes = b;
  return true;
}

uint64_t loadLE(const uint8_t* p, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void storeLE(uint64_t v, size_t width, std::vector<uint8_t>& out) {
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// A binary float of `expBits` exponent and `manBits` mantissa bits to double (exact: every
// such format with expBits <= 11, manBits <= 52 is a subset of double). `ieeeSpecials`: an
// all-ones exponent means infinity or NaN; without it (float8_e4m3fn) only all-ones exponent
// and mantissa is NaN and the rest are ordinary numbers.
double decodeFloat(uint64_t bits, int expBits, int manBits, bool ieeeSpecials) {
  const bool negative = (bits >> (expBits + manBits)) & 1;
  const uint64_t expMax = (uint64_t{1} << expBits) - 1, manMax = (uint64_t{1} << manBits) - 1;
  const uint64_t e = (bits >> manBits) & expMax, m = bits & manMax;
  const int bias = (1 << (expBits - 1)) - 1;
  double v;
  if (ieeeSpecials && e == expMax) v = m == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  else if (!ieeeSpecials && e == expMax && m == manMax) v = std::nan("");
  else if (e == 0) v = std::ldexp(static_cast<double>(m), 1 - bias - manBits);
  else v = std::ldexp(static_cast<double>(m | (manMax + 1)), static_cast<int>(e) - bias - manBits);
  return negative ? -v : v;
}

// double to an IEEE-style float of `expBits`/`manBits` (F16, BF16), rounded to nearest even
// straight from the double: going through float first would round twice and get ties wrong.
uint64_t encodeFloat(double x, int expBits, int manBits) {
  uint64_t d;
  std::memcpy(&d, &x, sizeof d);
  const uint64_t sign = (d >> 63) << (expBits + manBits);
  const uint64_t expAllOnes = ((uint64_t{1} << expBits) - 1) << manBits;
  const int dExp = static_cast<int>((d >> 52) & 0x7ff);
  const uint64_t dMan = d & ((uint64_t{1} << 52) - 1);
  if (dExp == 0x7ff) return sign | expAllOnes | (dMan ? uint64_t{1} << (manBits - 1) : 0);
  if (dExp == 0) return sign;  // zero or a double subnormal: far below any target's smallest value
  const int bias = (1 << (expBits - 1)) - 1;
  int e = dExp - 1023;
  const uint64_t sig = dMan | (uint64_t{1} << 52);  // 53 significant bits
  // Below the target's smallest normal exponent the result is subnormal: drop more bits.
  const int extra = e < 1 - bias ? (1 - bias) - e : 0;
  const int shift = std::min(52 - manBits + extra, 60);  // beyond 54 the result is 0 anyway
  uint64_t r = sig >> shift;
  const uint64_t rest = sig & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
  if (rest > half || (rest == half && (r & 1))) ++r;
  // A subnormal r counts in units of the smallest subnormal, which is the encoding itself (a
  // carry into 1 << manBits is exactly the smallest normal).
  if (extra > 0) return sign | r;
  if (r >> (manBits + 1)) {  // rounding carried into the next binade
    r >>= 1;
    ++e;
  }
  const int64_t biased = static_cast<int64_t>(e) + bias;
  if (biased >= (int64_t{1} << expBits) - 1) return sign | expAllOnes;  // overflow: infinity
  return sign | (static_cast<uint64_t>(biased) << manBits) | (r & ((uint64_t{1} << manBits) - 1));
}

std::string errnoText(int err) { return std::generic_category().message(err); }

void requireShape(const std::string& name, const std::vector<int64_t>& shape, size_t count) {
  int64_t numel = 0;
  size_t bytes = 0;
  if (!byteCount(shape, DType::U8, numel, bytes) || static_cast<size_t>(numel) != count)
    throw std::invalid_argument("safetensors tensor " + shown(name) + ": " + std::to_string(count) +
                                " values do not fill shape " + shapeText(shape));
}

template <class T, class ToBits>
Tensor make(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& values,
            ToBits toBits) {
  requireShape(name, shape, values.size());
  Tensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.reserve(values.size() * dtypeSize(dtype));
  for (const T& v : values) storeLE(toBits(v), dtypeSize(dtype), t.bytes);
  return t;
}

// Note on the two passes over the header, both through nlohmann's SAX interface. The first
// checks the syntax, the depth and every object's keys (nlohmann itself keeps one value of a
// repeated key silently), so that syntax errors come first, as in any JSON reader. The second
// reads the entries straight into TensorInfo and Metadata. No tree of JSON values is built: the
// format needs none, a tree of small values costs ~35 bytes per byte of header (3.4 GB for a
// 100 MB header of empty objects), and nlohmann's callback parser, which could check keys while
// building one, scans the enclosing container at every object's end: quadratic in the tensors.
class HeaderScanner : public nlohmann::json_sax<nlohmann::json> {
public:
  explicit HeaderScanner(const std::string& file) : file_(file) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    enter();
    objects_.push_back(Frame{{}, objects_.empty() ? std::string() : objects_.back().lastKey, {}});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = objects_.back();
    f.lastKey = k;
    if (!f.keys.insert(k).second)
      throw FormatError(file_, "header gives key " + shown(k) + " twice" +
                                   (objects_.size() > 1 ? " (in " + shown(f.parentKey) + ")" : std::string()));
    return true;
  }
  bool end_object() override {
    objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    enter();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // The message quotes the token read last, which comes from the file: any bytes, any length.
    throw FormatError(file_, "header is not valid JSON: " + printable(e.what(), 300));
  }

private:
  struct Frame {
    std::set<std::string> keys;
    std::string parentKey;  // the key this object is the value of, for messages
    std::string lastKey;
  };
  const std::string& file_;
  std::vector<Frame> objects_;
  int depth_ = 0;

  void enter() {
    if (++depth_ > kMaxDepth)
      throw FormatError(file_, "header nests lists and objects deeper than " + std::to_string(kMaxDepth) + " levels");
  }
};

// The second pass: a state per place in the format's structure; a value of the wrong kind
// where it arrives throws at once, with the same words a check on a whole tree would use.
class HeaderReader : public nlohmann::json_sax<nlohmann::json> {
public:
  HeaderReader(const std::string& file, size_t bufferSize, Metadata& metadata, std::vector<TensorInfo>& tensors)
      : file_(file), bufferSize_(bufferSize), metadata_(metadata), tensors_(tensors) {}

  bool null() override { return arrive(Kind::Scalar, nlohmann::json(nullptr)); }
  bool boolean(bool v) override { return arrive(Kind::Scalar, nlohmann::json(v)); }
  bool number_integer(number_integer_t v) override { return arrive(Kind::Scalar, nlohmann::json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return arrive(Kind::Scalar, nlohmann::json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return arrive(Kind::Scalar, nlohmann::json(v)); }
  bool string(string_t& v) override { return arrive(Kind::Scalar, nlohmann::json(std::move(v))); }
  bool binary(binary_t&) override { return true; }  // JSON text has no binary values
  bool start_object(std::size_t) override { return arrive(Kind::Object, nlohmann::json()); }
  bool start_array(std::size_t) override { return arrive(Kind::List, nlohmann::json()); }

  bool key(string_t& k) override {
    switch (state_) {
    case State::Top: key_ = k; break;
    case State::Metadata: field_ = k; break;
    case State::Entry:
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        throw fail("unexpected key " + shown(k) + " (an entry has dtype, shape and data_offsets)");
      field_ = k;
      break;
    case State::Skip: break;
    case State::Start:
    case State::Shape:
    case State::Offsets:
    case State::Done: assert(false && "keys come only inside objects"); break;
    }
    return true;
  }

  bool end_object() override {
    switch (state_) {
    case State::Skip: leaveSkipped(); break;
    case State::Entry:
      finishEntry();
      state_ = State::Top;
      break;
    case State::Metadata: state_ = State::Top; break;
    case State::Top: state_ = State::Done; break;
    case State::Start:
    case State::Shape:
    case State::Offsets:
    case State::Done: assert(false && "no object is open here"); break;
    }
    return true;
  }

  bool end_array() override {
    switch (state_) {
    case State::Skip: leaveSkipped(); break;
    case State::Shape: state_ = State::Entry; break;
    case State::Offsets:
      finishOffsets();
      state_ = State::Entry;
      break;
    case State::Start:
    case State::Top:
    case State::Metadata:
    case State::Entry:
    case State::Done: assert(false && "no list is open here"); break;
    }
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // The first pass read the same text without an error; kept for safety.
    throw FormatError(file_, "header is not valid JSON: " + printable(e.what(), 300));
  }

private:
  enum class Kind { Scalar, List, Object };
  // Where the next value goes. Skip: inside a list or object in data_offsets, which counts as
  // one (wrong) value whatever it holds, so that the list's length can still be told.
  enum class State { Start, Top, Metadata, Entry, Shape, Offsets, Skip, Done };

  const std::string& file_;
  const size_t bufferSize_;
  Metadata& metadata_;
  std::vector<TensorInfo>& tensors_;
  State state_ = State::Start;
  std::string key_;    // the top-level key being read
  std::string field_;  // the key inside the entry or metadata being read
  TensorInfo entry_;
  bool hasDtype_ = false, hasShape_ = false, hasOffsets_ = false;
  size_t offsetCount_ = 0, firstBadOffset_ = 0, skipDepth_ = 0;
  std::string badOffset_;  // what the first value in data_offsets that is not an offset was
  uint64_t bounds_[2] = {0, 0};

  FormatError fail(const std::string& problem) const {
    return FormatError(file_, "tensor " + shown(key_) + ": " + problem);
  }
  static std::string what(Kind kind, const nlohmann::json& scalar) {
    switch (kind) {
    case Kind::Scalar: return describe(scalar);
    case Kind::List: return "a list";
    case Kind::Object: return "an object";
    }
    return "a value";
  }

  bool arrive(Kind kind, const nlohmann::json& scalar) {
    switch (state_) {
    case State::Start:
      if (kind != Kind::Object) throw FormatError(file_, "header is " + what(kind, scalar) + ", not a JSON object");
      state_ = State::Top;
      break;
    case State::Top:
      if (key_ == "__metadata__") {
        if (kind != Kind::Object)
          throw FormatError(file_, "__metadata__ is " + what(kind, scalar) + ", not an object of strings");
        state_ = State::Metadata;
        break;
      }
      if (kind != Kind::Object) throw fail("entry is " + what(kind, scalar) + ", not an object");
      entry_ = TensorInfo();
      entry_.name = key_;
      hasDtype_ = hasShape_ = hasOffsets_ = false;
      state_ = State::Entry;
      break;
    case State::Metadata:
      if (kind != Kind::Scalar || !scalar.is_string())
        throw FormatError(file_, "__metadata__ " + shown(field_) + " is " + what(kind, scalar) + ", not a string");
      metadata_[field_] = scalar.get<std::string>();
      break;
    case State::Entry: field(kind, scalar); break;
    case State::Shape: {
      const std::string at = "shape[" + std::to_string(entry_.shape.size()) + "] is ";
      uint64_t d = 0;
      if (kind != Kind::Scalar || !nonNegativeInteger(scalar, d))
        throw fail(at + what(kind, scalar) + ", not a non-negative integer");
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw fail(at + std::to_string(d) + ", above 2^63 - 1");
      entry_.shape.push_back(static_cast<int64_t>(d));
      break;
    }
    case State::Offsets: {
      uint64_t v = 0;
      const bool ok = kind == Kind::Scalar && nonNegativeInteger(scalar, v);
      if (offsetCount_ < 2 && ok) bounds_[offsetCount_] = v;
      if (!ok && badOffset_.empty()) {
        badOffset_ = what(kind, scalar);
        firstBadOffset_ = offsetCount_;
      }
      ++offsetCount_;
      if (kind != Kind::Scalar) {
        state_ = State::Skip;
        skipDepth_ = 1;
      }
      break;
    }
    case State::Skip:
      if (kind != Kind::Scalar) ++skipDepth_;
      break;
    case State::Done: assert(false && "the first pass allows one value only"); break;
    }
    return true;
  }

  // A value of an entry: field_ is one of the three keys (key() rejected the rest).
  void field(Kind kind, const nlohmann::json& scalar) {
    if (field_ == "dtype") {
      if (kind != Kind::Scalar || !scalar.is_string()) throw fail("dtype is " + what(kind, scalar) + ", not a string");
      if (!parseDType(scalar.get<std::string>(), entry_.dtype))
        throw fail("unknown dtype " + shown(scalar.get<std::string>()) + "; valid: " + validDTypes());
      hasDtype_ = true;
    } else if (field_ == "shape") {
      if (kind != Kind::List) throw fail("shape is " + what(kind, scalar) + ", not a list of non-negative integers");
      state_ = State::Shape;
      hasShape_ = true;
    } else {
      if (kind != Kind::List)
        throw fail("data_offsets is " + what(kind, scalar) + ", not two non-negative integers [begin, end]");
      state_ = State::Offsets;
      offsetCount_ = 0;
      badOffset_.clear();
      hasOffsets_ = true;
    }
  }

  void leaveSkipped() {
    if (--skipDepth_ == 0) state_ = State::Offsets;
  }

  void finishOffsets() {
    if (offsetCount_ != 2)
      throw fail("data_offsets is a list of " + std::to_string(offsetCount_) +
                 " values, not two non-negative integers [begin, end]");
    if (!badOffset_.empty())
      throw fail("data_offsets[" + std::to_string(firstBadOffset_) + "] is " + badOffset_ +
                 ", not a non-negative integer");
  }

  void finishEntry() {
    if (!hasDtype_) throw fail("has no \"dtype\"");
    if (!hasShape_) throw fail("has no \"shape\"");
    if (!hasOffsets_) throw fail("has no \"data_offsets\"");
    int64_t numel = 0;
    size_t needed = 0;
    if (!byteCount(entry_.shape, entry_.dtype, numel, needed))
      throw fail("shape " + shapeText(entry_.shape) + " of " + dtypeName(entry_.dtype) +
                 " overflows: its element or byte count does not fit 64 bits");
    const uint64_t begin = bounds_[0], end = bounds_[1];
    const std::string range = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end) throw fail(range + " begin after they end");
    if (end > bufferSize_)
      throw fail(range + " end beyond the data buffer of " + std::to_string(bufferSize_) + " bytes");
    entry_.begin = static_cast<size_t>(begin);
    entry_.end = static_cast<size_t>(end);
    if (entry_.end - entry_.begin != needed)
      throw fail(range + " hold " + std::to_string(entry_.end - entry_.begin) + " bytes but shape " +
                 shapeText(entry_.shape) + " of " + dtypeName(entry_.dtype) + " needs " + std::to_string(needed));
    tensors_.push_back(std::move(entry_));
  }
};

// A regular file open for reading, with its size; closed on destruction.
struct OpenFile {
  int fd = -1;
  size_t size = 0;
  explicit OpenFile(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw FormatError(path, "cannot open: " + errnoText(errno));
    struct stat st;
    const bool statted = ::fstat(fd, &st) == 0;
    const int err = errno;
    if (!statted || !S_ISREG(st.st_mode)) {
      ::close(fd);
      if (!statted) throw FormatError(path, "cannot read: " + errnoText(err));
      throw FormatError(path, S_ISDIR(st.st_mode) ? "is a directory, not a safetensors file" : "is not a regular file");
    }
    size = static_cast<size_t>(st.st_size);
  }
  ~OpenFile() { ::close(fd); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
};

// The header's checks and contents, and the tiling of a data buffer of `bufferSize` bytes:
// what File::parse and readMetadata share.
void readHeader(const std::string& name, const char* text, uint64_t n, size_t bufferSize, Metadata& metadata,
                std::vector<TensorInfo>& tensors) {
  const auto fail = [&name](const std::string& problem) { return FormatError(name, problem); };
  // nlohmann takes a NUL byte for the end of its input and would ignore what follows; JSON has
  // no place for one.
  if (const void* nul = std::memchr(text, '\0', static_cast<size_t>(n)))
    throw fail("header is not valid JSON: a NUL byte at header offset " +
               std::to_string(static_cast<const char*>(nul) - text));
  HeaderScanner scanner(name);
  nlohmann::json::sax_parse(text, text + n, &scanner);
  HeaderReader reader(name, bufferSize, metadata, tensors);
  nlohmann::json::sax_parse(text, text + n, &reader);

  // Note on tiling. Sorted by (begin, end), the ranges tile [0, bufferSize) exactly when each
  // begins where the one before ends and the last ends at bufferSize; empty ranges then sit
  // between two others or at either end. The reference implementation rejects everything else,
  // so a hole (bytes no tensor owns) is an error too, not only an overlap.
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const auto where = [](const TensorInfo& t) {
    return shown(t.name) + " [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
  };
  size_t pos = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    if (t.begin < pos) throw fail("tensors " + where(tensors[i - 1]) + " and " + where(t) + " overlap");
    if (t.begin > pos)
      throw fail("data buffer bytes [" + std::to_string(pos) + ", " + std::to_string(t.begin) +
                 ") belong to no tensor (a hole " +
                 (i == 0 ? "before " + where(t) : "between " + where(tensors[i - 1]) + " and " + where(t)) + ")");
    pos = t.end;
  }
  if (pos != bufferSize)
    throw fail("data buffer has " + std::to_string(bufferSize - pos) + " bytes after " +
               (tensors.empty() ? std::string("a header listing no tensor")
                                   : "the last tensor " + where(tensors.back())) +
               "; they belong to no tensor");
}

}  // namespace

const char* dtypeName(DType t) {
  switch (t) {
  case DType::F64: return "F64";
  case DType::F32: return "F32";
  case DType::F16: return "F16";
  case DType::BF16: return "BF16";
  case DType::F8_E4M3: return "F8_E4M3";
  case DType::F8_E5M2: return "F8_E5M2";
  case DType::I64: return "I64";
  case DType::I32: return "I32";
  case DType::I16: return "I16";
  case DType::I8: return "I8";
  case DType::U64: return "U64";
  case DType::U32: return "U32";
  case DType::U16: return "U16";
  case DType::U8: return "U8";
  case DType::Bool: return "BOOL";
  }
  return "?";
}

size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F64:
  case DType::I64:
  case DType::U64: return 8;
  case DType::F32:
  case DType::I32:
  case DType::U32: return 4;
  case DType::F16:
  case DType::BF16:
  case DType::I16:
  case DType::U16: return 2;
  case DType::F8_E4M3:
  case DType::F8_E5M2:
  case DType::I8:
  case DType::U8:
  case DType::Bool: return 1;
  }
  return 1;
}

bool parseDType(const std::string& name, DType& out) {
  for (DType t : kAllDTypes)
    if (name == dtypeName(t)) {
      out = t;
      return true;
    }
  return false;
}

bool isFloat(DType t) {
  switch (t) {
  case DType::F64:
  case DType::F32:
  case DType::F16:
  case DType::BF16:
  case DType::F8_E4M3:
  case DType::F8_E5M2: return true;
  case DType::I64:
  case DType::I32:
  case DType::I16:
  case DType::I8:
  case DType::U64:
  case DType::U32:
  case DType::U16:
  case DType::U8:
  case DType::Bool: return false;
  }
  return false;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  return make(name, DType::F32, std::move(shape), values, [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return uint64_t{b};
  });
}

Tensor Tensor::f64(const std::string& name, std::vector<int64_t> shape, const std::vector<double>& values) {
  return make(name, DType::F64, std::move(shape), values, [](double v) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  });
}

Tensor Tensor::i64(const std::string& name, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  return make(name, DType::I64, std::move(shape), values, [](int64_t v) { return static_cast<uint64_t>(v); });
}

Tensor Tensor::u64(const std::string& name, std::vector<int64_t> shape, const std::vector<uint64_t>& values) {
  return make(name, DType::U64, std::move(shape), values, [](uint64_t v) { return v; });
}

Tensor Tensor::fromDoubles(const std::string& name, DType dtype, std::vector<int64_t> shape,
                           const std::vector<double>& values) {
  switch (dtype) {
  case DType::F64: return f64(name, std::move(shape), values);
  case DType::F32: {
    std::vector<float> f(values.begin(), values.end());  // the conversion rounds to nearest even
    return f32(name, std::move(shape), f);
  }
  case DType::F16: return make(name, dtype, std::move(shape), values, [](double v) { return encodeFloat(v, 5, 10); });
  case DType::BF16: return make(name, dtype, std::move(shape), values, [](double v) { return encodeFloat(v, 8, 7); });
  case DType::F8_E4M3:
  case DType::F8_E5M2:
  case DType::I64:
  case DType::I32:
  case DType::I16:
  case DType::I8:
  case DType::U64:
  case DType::U32:
  case DType::U16:
  case DType::U8:
  case DType::Bool: break;
  }
  throw std::invalid_argument(std::string("Tensor::fromDoubles: ") + dtypeName(dtype) +
                              " is not one of F64, F32, F16, BF16");
}

std::string serialize(const std::vector<Tensor>& tensors, const Metadata& metadata) {
  // Each entry is an ordered_json (its keys in the order of the format's description); the
  // top-level object is joined here, as ordered_json looks keys up linearly and n tensors would
  // cost n^2.
  std::string text = "{";
  const auto add = [&text](const std::string& key, const nlohmann::ordered_json& value) {
    if (text.size() > 1) text += ",";
    try {
      text += nlohmann::ordered_json(key).dump() + ":" + value.dump();
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("safetensors: " + shown(key) + ": a name or metadata string is not UTF-8: " +
                                  e.what());
    }
  };
  if (!metadata.empty()) add("__metadata__", nlohmann::ordered_json(metadata));
  std::set<std::string> names;
  size_t offset = 0;
  for (const Tensor& t : tensors) {
    if (t.name == "__metadata__") throw std::invalid_argument("safetensors: a tensor cannot be named '__metadata__'");
    if (!names.insert(t.name).second)
      throw std::invalid_argument("safetensors: tensor name " + shown(t.name) + " given twice");
    int64_t numel = 0;
    size_t bytes = 0;
    if (!byteCount(t.shape, t.dtype, numel, bytes) || bytes != t.bytes.size())
      throw std::invalid_argument("safetensors tensor " + shown(t.name) + ": " + std::to_string(t.bytes.size()) +
                                  " bytes do not match shape " + shapeText(t.shape) + " of " + dtypeName(t.dtype));
    add(t.name, {{"dtype", dtypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}});
    offset += bytes;
  }
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  std::string out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  out += text;
  for (const Tensor& t : tensors) out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  return out;
}

void write(const std::string& path, const std::vector<Tensor>& tensors, const Metadata& metadata) {
  const std::string bytes = serialize(tensors, metadata);
  try {
    writeFileAtomically(path, bytes);
  } catch (const UserError& e) {
    // writeFileAtomically already says "<path>: ..."; FormatError adds the path itself.
    std::string problem = e.what();
    if (problem.compare(0, path.size() + 2, path + ": ") == 0) problem.erase(0, path.size() + 2);
    throw FormatError(path, problem);
  }
}

File File::read(const std::string& path) {
  const OpenFile f(path);
  std::string bytes(f.size, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(f.fd, &bytes[got], bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FormatError(path, "cannot read: " + errnoText(errno));
    if (n == 0) break;  // shrank since fstat: check what is there
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  return parse(std::move(bytes), path);
}

File File::parse(std::string bytes, const std::string& name) {
  File f;
  f.name_ = name;
  f.bytes_ = std::move(bytes);
  const auto fail = [&name](const std::string& problem) { return FormatError(name, problem); };
  const size_t size = f.bytes_.size();
  if (size < 8)
    throw fail("truncated: " + std::to_string(size) + " bytes, fewer than the 8 of the header length");
  const uint64_t n = loadLE(reinterpret_cast<const uint8_t*>(f.bytes_.data()), 8);
  if (n > kMaxHeaderBytes)
    throw fail("header length " + std::to_string(n) + " is above the limit of " + std::to_string(kMaxHeaderBytes) +
               " bytes");
  if (n > size - 8)
    throw fail("header length " + std::to_string(n) + " is larger than the file's remaining " +
               std::to_string(size - 8) + " bytes");
  f.dataStart_ = 8 + static_cast<size_t>(n);

  readHeader(name, f.bytes_.data() + 8, n, size - f.dataStart_, f.metadata_, f.tensors_);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

Metadata readMetadata(const std::string& path) {
  const OpenFile f(path);
  const int fd = f.fd;
  const size_t size = f.size;
  auto readAt = [&](char* to, size_t count, size_t offset) {
    size_t got = 0;
    while (got < count) {
      const ssize_t r = ::pread(fd, to + got, count - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw FormatError(path, "cannot read: " + errnoText(errno));
      if (r == 0) throw FormatError(path, "truncated: the file shrank while it was read");
      got += static_cast<size_t>(r);
    }
  };
  if (size < 8) throw FormatError(path, "truncated: " + std::to_string(size) + " bytes, fewer than the 8 of the header length");
  char head[8];
  readAt(head, 8, 0);
  const uint64_t n = loadLE(reinterpret_cast<const uint8_t*>(head), 8);
  if (n > kMaxHeaderBytes)
    throw FormatError(path, "header length " + std::to_string(n) + " is above the limit of " +
                                std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    throw FormatError(path, "header length " + std::to_string(n) + " is larger than the file's remaining " +
                                std::to_string(size - 8) + " bytes");
  std::string text(static_cast<size_t>(n), '\0');
  readAt(text.data(), text.size(), 8);
  Metadata metadata;
  std::vector<TensorInfo> tensors;
  readHeader(path, text.data(), n, size - 8 - static_cast<size_t>(n), metadata, tensors);
  return metadata;
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* File::data(const TensorInfo& t) const {
  checkOwn(t);
  return reinterpret_cast<const uint8_t*>(bytes_.data()) + dataStart_ + t.begin;
}

void File::checkOwn(const TensorInfo& t) const {
  // A TensorInfo of another file, or one edited since, must not read outside this one.
  const TensorInfo* own = find(t.name);
  if (!own || own->begin != t.begin || own->end != t.end || own->dtype != t.dtype || own->shape != t.shape)
    throw std::invalid_argument(name_ + ": tensor " + shown(t.name) + " is not one of this file's");
}

std::vector<double> File::toDoubles(const TensorInfo& t) const {
  const uint8_t* p = data(t);
  const size_t width = dtypeSize(t.dtype), count = (t.end - t.begin) / width;
  std::vector<double> out;
  switch (t.dtype) {
  case DType::F64:
  case DType::F32:
  case DType::F16:
  case DType::BF16:
  case DType::F8_E4M3:
  case DType::F8_E5M2: break;
  case DType::I64:
  case DType::I32:
  case DType::I16:
  case DType::I8:
  case DType::U64:
  case DType::U32:
  case DType::U16:
  case DType::U8:
  case DType::Bool:
    throw FormatError(name_, "tensor " + shown(t.name) + " is " + dtypeName(t.dtype) + ", not a floating-point tensor");
  }
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = loadLE(p + i * width, width);
    double v = 0;
    switch (t.dtype) {
    case DType::F64: std::memcpy(&v, &bits, sizeof v); break;
    case DType::F32: {
      const uint32_t b = static_cast<uint32_t>(bits);
      float x;
      std::memcpy(&x, &b, sizeof x);
      v = x;
      break;
    }
    case DType::F16: v = decodeFloat(bits, 5, 10, true); break;
    case DType::BF16: v = decodeFloat(bits, 8, 7, true); break;
    case DType::F8_E4M3: v = decodeFloat(bits, 4, 3, false); break;
    case DType::F8_E5M2: v = decodeFloat(bits, 5, 2, true); break;
    case DType::I64:
    case DType::I32:
    case DType::I16:
    case DType::I8:
    case DType::U64:
    case DType::U32:
    case DType::U16:
    case DType::U8:
    case DType::Bool: assert(false && "rejected above"); break;
    }
    out.push_back(v);
  }
  return out;
}

std::vector<int64_t> File::toInt64(const TensorInfo& t) const {
  if (t.dtype != DType::I64 && t.dtype != DType::U64)
    throw FormatError(name_, "tensor " + shown(t.name) + " is " + dtypeName(t.dtype) + ", not I64 or U64");
  const uint8_t* p = data(t);
  std::vector<int64_t> out;
  out.reserve((t.end - t.begin) / 8);
  for (size_t i = 0; i < (t.end - t.begin) / 8; ++i) {
    const uint64_t v = loadLE(p + 8 * i, 8);
    if (t.dtype == DType::U64 && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw FormatError(name_, "tensor " + shown(t.name) + ": U64 value " + std::to_string(v) + " at index " +
                                   std::to_string(i) + " does not fit an int64");
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

std::vector<uint64_t> File::toUint64(const TensorInfo& t) const {
  if (t.dtype != DType::U64)
    throw FormatError(name_, "tensor " + shown(t.name) + " is " + dtypeName(t.dtype) + ", not U64");
  const uint8_t* p = data(t);
  std::vector<uint64_t> out;
  out.reserve((t.end - t.begin) / 8);
  for (size_t i = 0; i < (t.end - t.begin) / 8; ++i) out.push_back(loadLE(p + 8 * i, 8));
  return out;
}

}  // namespace pa::safetensors
