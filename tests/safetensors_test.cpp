// The safetensors reader and writer: round trips, a file written by hand from the format, every
// class of damaged file, atomic writes under failure, interoperability with Python, and fuzzing.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "frontend/atomic_file.h"
#include "frontend/safetensors.h"

namespace pa::safetensors {
namespace {

namespace fs = std::filesystem;

constexpr DType kAll[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                          DType::F8_E5M2, DType::I64, DType::I32, DType::I16, DType::I8,
                          DType::U64, DType::U32, DType::U16, DType::U8, DType::Bool};

// A folder of the running test's own (ctest runs each test in its own process, in parallel),
// removed when the test ends.
class TempDir {
public:
  TempDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = fs::temp_directory_path() / ("pa_safetensors_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

private:
  fs::path path_;
};

std::string readBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Little-endian, byte by byte, as the format defines it: independent of the code under test.
std::string le(uint64_t v, int width) {
  std::string s;
  for (int i = 0; i < width; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file from a header text and a data buffer: the length prefix, the header, the buffer.
std::string fileOf(const std::string& header, const std::string& buffer = "") {
  return le(header.size(), 8) + header + buffer;
}

std::vector<std::string> temporariesIn(const fs::path& dir) {
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) found.push_back(e.path().string());
  return found;
}

// Messages quote bytes from files: they must stay one printable line of sane length.
bool printableAscii(const std::string& m) {
  for (char c : m)
    if (c < 0x20 || c > 0x7e) return false;
  return m.size() < 1000;
}

// The message of the FormatError `f` throws ("" and a test failure when it throws none).
std::string formatErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no FormatError thrown";
  return "";
}

std::vector<uint8_t> randomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

TEST(Safetensors, RoundTripKeepsEveryDtypeShapeAndMetadata) {
  TempDir dir;
  std::mt19937_64 rng(7);
  const std::vector<std::vector<int64_t>> shapes = {{}, {3}, {2, 3}, {0}, {2, 0, 4}, {1, 1, 5}};
  std::vector<Tensor> tensors;
  for (DType d : kAll)
    for (size_t s = 0; s < shapes.size(); ++s) {
      Tensor t;
      t.name = std::string("layers.") + dtypeName(d) + "." + std::to_string(s);
      t.dtype = d;
      t.shape = shapes[s];
      int64_t numel = 1;
      for (int64_t x : t.shape) numel *= x;
      t.bytes = randomBytes(rng, static_cast<size_t>(numel) * dtypeSize(d));
      tensors.push_back(t);
    }
  const Metadata metadata = {{"format", "pt"}, {"step", "12"}, {"unicode", "\xce\xbc"}, {"", "empty key"}};
  const fs::path path = dir.path() / "w.safetensors";
  write(path.string(), tensors, metadata);

  const std::string bytes = readBytes(path);
  EXPECT_EQ(bytes, serialize(tensors, metadata));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes.at(i))} << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data starts 8-byte aligned";
  EXPECT_EQ(bytes.compare(8, 16, "{\"__metadata__\":"), 0) << "metadata comes first";

  const File f = File::read(path.string());
  EXPECT_EQ(f.name(), path.string());
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(tensors[i].name);
    EXPECT_EQ(t.name, tensors[i].name) << "the tensors stay in the order given";
    EXPECT_EQ(t.dtype, tensors[i].dtype);
    EXPECT_EQ(t.shape, tensors[i].shape);
    EXPECT_EQ(t.end - t.begin, tensors[i].bytes.size());
    EXPECT_EQ(std::vector<uint8_t>(f.data(t), f.data(t) + (t.end - t.begin)), tensors[i].bytes);
    EXPECT_EQ(f.find(t.name), &t);
  }
  EXPECT_EQ(f.find("absent"), nullptr);

  // No metadata: no "__metadata__" key at all.
  EXPECT_EQ(serialize({Tensor::f32("a", {1}, {1.0f})}, {}).find("__metadata__"), std::string::npos);
}

TEST(Safetensors, ReadsAFileWrittenByHandFromTheFormat) {
  // Written from the format's description, not by serialize: tensors listed out of data order,
  // metadata last, spaces, and a header length that is not a multiple of 8.
  const std::string header = R"({"b": {"dtype": "I32", "shape": [2], "data_offsets": [16, 24]},)"
                             R"( "a": {"shape": [2, 2], "dtype": "F32", "data_offsets": [0, 16]},)"
                             R"( "__metadata__": {"format": "pt"}})";
  ASSERT_NE(header.size() % 8, 0u);
  const std::string buffer = std::string("\x00\x00\x80\x3f", 4) +  // 1.0f
                             std::string("\x00\x00\x00\xc0", 4) +  // -2.0f
                             std::string("\x00\x00\x00\x3f", 4) +  // 0.5f
                             std::string("\x00\x00\x40\x40", 4) +  // 3.0f
                             std::string("\x07\x00\x00\x00", 4) +  // 7
                             std::string("\xff\xff\xff\xff", 4);   // -1
  const File f = File::parse(fileOf(header, buffer), "hand.safetensors");
  EXPECT_EQ(f.metadata(), (Metadata{{"format", "pt"}}));
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a") << "tensors come in data order";
  const TensorInfo* a = f.find("a");
  const TensorInfo* b = f.find("b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a->numel(), 4);
  EXPECT_EQ(f.toDoubles(*a), (std::vector<double>{1.0, -2.0, 0.5, 3.0}));
  EXPECT_EQ(b->dtype, DType::I32);
  EXPECT_EQ(b->begin, 16u);
  EXPECT_EQ(b->end, 24u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data(*b)), 8), buffer.substr(16));
}

TEST(Safetensors, AcceptsEmptyTensorsScalarsAndFilesWithoutTensors) {
  EXPECT_TRUE(File::parse(fileOf("{}"), "x").tensors().empty());
  EXPECT_TRUE(File::parse(fileOf(R"({"__metadata__": {}})"), "x").metadata().empty());
  // Empty tensors at the start, between two others (same offset as their neighbours) and at the end.
  const File f = File::parse(fileOf(R"({"e0": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]},)"
                                    R"( "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},)"
                                    R"( "e1": {"dtype": "I64", "shape": [3, 0], "data_offsets": [8, 8]},)"
                                    R"( "e2": {"dtype": "BOOL", "shape": [0], "data_offsets": [8, 8]}})",
                                    le(0x4004000000000000u, 8)),  // 2.5
                             "x");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.toDoubles(*f.find("s")), (std::vector<double>{2.5}));
  EXPECT_EQ(f.find("s")->numel(), 1);
  EXPECT_TRUE(f.toDoubles(*f.find("e0")).empty());
  EXPECT_TRUE(f.toInt64(*f.find("e1")).empty());
  EXPECT_EQ(f.find("e2")->dtype, DType::Bool);
}

TEST(Safetensors, ConvertsEveryFloatDtypeExactly) {
  const std::string header =
      R"({"h": {"dtype": "F16", "shape": [8], "data_offsets": [0, 16]},)"
      R"( "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},)"
      R"( "e4": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [24, 32]},)"
      R"( "e5": {"dtype": "F8_E5M2", "shape": [8], "data_offsets": [32, 40]},)"
      R"( "d": {"dtype": "F64", "shape": [1], "data_offsets": [40, 48]},)"
      R"( "f": {"dtype": "F32", "shape": [1], "data_offsets": [48, 52]}})";
  std::string buffer;
  for (uint64_t h : {0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00, 0x8000, 0x3555, 0x7e00}) buffer += le(h, 2);
  for (uint64_t b : {0x3f80, 0x0001, 0x7f7f, 0xff80}) buffer += le(b, 2);
  for (uint64_t e : {0x38, 0x7e, 0x01, 0x80, 0x7f, 0xff, 0x08, 0x78}) buffer += le(e, 1);
  for (uint64_t e : {0x3c, 0x7b, 0x7c, 0x01, 0x7f, 0xfc, 0x04, 0x42}) buffer += le(e, 1);
  buffer += le(0x3fb999999999999au, 8) + le(0x3dcccccd, 4);
  const File f = File::parse(fileOf(header, buffer), "floats.safetensors");
  const double inf = std::numeric_limits<double>::infinity();
  // NaN compares unequal: checked apart, and replaced by a marker for the comparisons.
  const auto values = [&f](const char* name, std::vector<size_t> nans) {
    std::vector<double> v = f.toDoubles(*f.find(name));
    for (size_t i : nans) {
      EXPECT_TRUE(std::isnan(v.at(i))) << name << "[" << i << "]";
      v[i] = 12345;
    }
    return v;
  };
  const std::vector<double> h = values("h", {7});
  EXPECT_EQ(h, (std::vector<double>{1, -2, std::ldexp(1, -24), 65504, inf, -0.0, 0.333251953125, 12345}));
  EXPECT_TRUE(std::signbit(h[5]));
  EXPECT_EQ(values("b", {}), (std::vector<double>{1, std::ldexp(1, -133), std::ldexp(255, 120), -inf}));
  const std::vector<double> e4 = values("e4", {4, 5});
  EXPECT_EQ(e4, (std::vector<double>{1, 448, std::ldexp(1, -9), -0.0, 12345, 12345, std::ldexp(1, -6), 256}));
  EXPECT_TRUE(std::signbit(e4[3]));
  EXPECT_EQ(values("e5", {4}),
            (std::vector<double>{1, 57344, inf, std::ldexp(1, -16), 12345, -inf, std::ldexp(1, -14), 3}));
  EXPECT_EQ(values("d", {}), (std::vector<double>{0.1}));
  EXPECT_EQ(values("f", {}), (std::vector<double>{static_cast<double>(0.1f)}));
}

TEST(Safetensors, FromDoublesRoundsToNearestEven) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto roundTrip = [](DType dtype, const std::vector<double>& in) {
    const Tensor t = Tensor::fromDoubles("t", dtype, {static_cast<int64_t>(in.size())}, in);
    const File f = File::parse(serialize({t}, {}), "t.safetensors");
    return f.toDoubles(f.tensors().at(0));
  };
  const double p = std::ldexp(1, -11);  // half an F16 unit at 1
  EXPECT_EQ(roundTrip(DType::F16, {1 + p, 1 + 3 * p, 1 + p + std::ldexp(1, -40), 65504, 65519.99, 65520, -65520, 1e10,
                                   std::ldexp(1, -25), 3 * std::ldexp(1, -25), std::ldexp(1, -24), std::ldexp(1, -26),
                                   std::ldexp(1, -14) - std::ldexp(1, -25), 1e-300, -inf}),
            (std::vector<double>{1, 1 + 4 * p, 1 + 2 * p, 65504, 65504, inf, -inf, inf, 0, std::ldexp(1, -23),
                                 std::ldexp(1, -24), 0, std::ldexp(1, -14), 0, -inf}))
      << "ties go to the even neighbour; 1 + 2^-11 + 2^-40 is above the tie (rounding through float would lose that)";
  const double q = std::ldexp(1, -8);  // half a BF16 unit at 1
  EXPECT_EQ(roundTrip(DType::BF16, {1 + q, 1 + 3 * q, 1 + q + std::ldexp(1, -40), std::ldexp(255, 120),
                                    std::ldexp(511, 119), std::ldexp(1, -133), std::ldexp(1, -134),
                                    3 * std::ldexp(1, -134), -2.5}),
            (std::vector<double>{1, 1 + 4 * q, 1 + 2 * q, std::ldexp(255, 120), inf, std::ldexp(1, -133), 0,
                                 std::ldexp(1, -132), -2.5}));
  EXPECT_EQ(roundTrip(DType::F32, {1 + std::ldexp(1, -24), 1 + 3 * std::ldexp(1, -24)}),
            (std::vector<double>{1, 1 + std::ldexp(1, -22)}));
  EXPECT_EQ(roundTrip(DType::F64, {0.1, -1e300}), (std::vector<double>{0.1, -1e300}));
  const std::vector<double> special = roundTrip(DType::F16, {std::nan(""), -0.0});
  EXPECT_TRUE(std::isnan(special[0]));
  EXPECT_TRUE(std::signbit(special[1]) && special[1] == 0);
  EXPECT_TRUE(std::isnan(roundTrip(DType::BF16, {std::nan("")})[0]));
}

TEST(Safetensors, IntegerTensorsConvertOnlyWhereExact) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const uint64_t hi = std::numeric_limits<uint64_t>::max();
  const File f = File::parse(serialize({Tensor::i64("i", {3}, {lo, -1, 5}), Tensor::u64("small", {2}, {0, 9}),
                                        Tensor::u64("big", {2}, {1, hi}), Tensor::f32("x", {1}, {1.5f})},
                                       {}),
                             "ints.safetensors");
  EXPECT_EQ(f.toInt64(*f.find("i")), (std::vector<int64_t>{lo, -1, 5}));
  EXPECT_EQ(f.toInt64(*f.find("small")), (std::vector<int64_t>{0, 9}));
  EXPECT_EQ(f.toUint64(*f.find("big")), (std::vector<uint64_t>{1, hi}));
  std::string m = formatErrorOf([&] { f.toInt64(*f.find("big")); });
  EXPECT_NE(m.find("ints.safetensors: tensor 'big': U64 value 18446744073709551615 at index 1 does not fit"),
            std::string::npos)
      << m;
  m = formatErrorOf([&] { f.toDoubles(*f.find("i")); });
  EXPECT_NE(m.find("tensor 'i' is I64, not a floating-point tensor"), std::string::npos) << m;
  m = formatErrorOf([&] { f.toInt64(*f.find("x")); });
  EXPECT_NE(m.find("tensor 'x' is F32, not I64 or U64"), std::string::npos) << m;
  m = formatErrorOf([&] { f.toUint64(*f.find("i")); });
  EXPECT_NE(m.find("tensor 'i' is I64, not U64"), std::string::npos) << m;
}

TEST(Safetensors, RejectsATensorInfoThatIsNotTheFiles) {
  const File f = File::parse(serialize({Tensor::f32("a", {2}, {1, 2})}, {}), "a.safetensors");
  TensorInfo widened = f.tensors()[0];
  widened.end = 1 << 20;
  widened.shape = {1 << 18};
  EXPECT_THROW(f.data(widened), std::invalid_argument);
  EXPECT_THROW(f.toDoubles(widened), std::invalid_argument);
  TensorInfo other = f.tensors()[0];
  other.name = "b";
  EXPECT_THROW(f.toDoubles(other), std::invalid_argument);
}

TEST(Safetensors, SerializeRejectsCallerMistakes) {
  const Tensor a = Tensor::f32("a", {2}, {1, 2});
  EXPECT_THROW(serialize({a, a}, {}), std::invalid_argument);
  Tensor meta = a;
  meta.name = "__metadata__";
  EXPECT_THROW(serialize({meta}, {}), std::invalid_argument);
  Tensor shortBytes = a;
  shortBytes.bytes.pop_back();
  EXPECT_THROW(serialize({shortBytes}, {}), std::invalid_argument);
  Tensor negative = a;
  negative.shape = {-2};
  EXPECT_THROW(serialize({negative}, {}), std::invalid_argument);
  Tensor notUtf8 = a;
  notUtf8.name = "\xff";
  EXPECT_THROW(serialize({notUtf8}, {}), std::invalid_argument);
  EXPECT_THROW(Tensor::f32("a", {3}, {1, 2}), std::invalid_argument);
  EXPECT_THROW(Tensor::fromDoubles("a", DType::I32, {1}, {1}), std::invalid_argument);
}

TEST(Safetensors, ReadNamesAMissingFileADirectoryAndADevice) {
  TempDir dir;
  const std::string missing = (dir.path() / "missing.safetensors").string();
  std::string m = formatErrorOf([&] { File::read(missing); });
  EXPECT_EQ(m, missing + ": cannot open: No such file or directory");
  m = formatErrorOf([&] { File::read(dir.path().string()); });
  EXPECT_EQ(m, dir.path().string() + ": is a directory, not a safetensors file");
  m = formatErrorOf([] { File::read("/dev/null"); });  // a device: reading it could never end (/dev/zero)
  EXPECT_EQ(m, "/dev/null: is not a regular file");
}

// A checkpoint of many tensors, and a header of many small values, cost time in proportion to
// their size: nlohmann's ordered objects and its callback parser are quadratic in the number of
// entries, which took minutes here. The bound is loose (linear takes well under a second, and a
// few under the sanitizers); quadratic takes minutes.
TEST(Safetensors, ManyTensorsWriteAndReadInLinearTime) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Tensor> tensors;
  for (int i = 0; i < 100000; ++i) tensors.push_back(Tensor::f32("layers." + std::to_string(i) + ".bias", {1}, {1.0f}));
  const File f = File::parse(serialize(tensors, {}), "many.safetensors");
  EXPECT_EQ(f.tensors().size(), tensors.size());
  std::string objects = R"({"__metadata__": {"k": [)";
  for (int i = 0; i < 200000; ++i) objects += "{},";
  const std::string m = formatErrorOf([&] { File::parse(fileOf(objects + "{}]}}"), "objects.safetensors"); });
  EXPECT_NE(m.find("__metadata__ 'k' is a list, not a string"), std::string::npos) << m;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

// Note on the damaged-file cases. Each is the smallest file showing one problem, so the message
// must name that problem (the expected substrings), after the file's name.
struct BadFile {
  const char* name;
  std::string bytes;
  std::vector<std::string> expected;
};

std::vector<BadFile> badFiles() {
  const std::string w48(48, '\0');  // the data of an F32 [3, 4]
  const auto one = [](const std::string& entry) { return R"({"w": )" + entry + "}"; };
  const std::string fine = R"({"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]})";
  const auto withShape = [&](const std::string& shape) {
    return one(R"({"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": [0, 48]})");
  };
  const auto withOffsets = [&](const std::string& offsets) {
    return one(R"({"dtype": "F32", "shape": [3, 4], "data_offsets": )" + offsets + "}");
  };
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "[";
  deep += std::string(100, ']');
  return {
      {"Truncated", std::string("\x05\x00\x00", 3), {"truncated: 3 bytes"}},
      {"HeaderLongerThanTheFile", le(1000, 8) + "{}", {"header length 1000 is larger than the file's remaining 2 bytes"}},
      {"HeaderAboveTheLimit", le(100000001, 8) + "{}", {"header length 100000001 is above the limit of 100000000 bytes"}},
      {"HeaderLengthNear2To64", le(~uint64_t{7}, 8) + "{}", {"header length 18446744073709551608 is above the limit"}},
      {"EmptyHeader", fileOf(""), {"header is not valid JSON", "parse error"}},
      {"HeaderNotJson", fileOf(R"({"w": )"), {"header is not valid JSON", "parse error", "unexpected end of input"}},
      {"HeaderNotUtf8", fileOf("{\"\xff\": 1}"), {"header is not valid JSON", "UTF-8"}},
      {"HeaderWithNulByte", fileOf(std::string("{}\0{\"x\": 1}", 11)),
       {"header is not valid JSON: a NUL byte at header offset 2"}},
      {"HeaderNotJsonShowsItsBytesPrintably", fileOf("{\"a\": 1, \x80\x81}"), {"header is not valid JSON", "\\x80"}},
      {"HeaderNotAnObject", fileOf("[1, 2]"), {"header is a list, not a JSON object"}},
      {"TensorNameTwice", fileOf(R"({"w": )" + fine + R"(, "w": )" + fine + "}", w48), {"header gives key 'w' twice"}},
      {"EntryKeyTwice", fileOf(one(R"({"dtype": "F32", "dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]})"), w48),
       {"header gives key 'dtype' twice (in 'w')"}},
      {"MetadataKeyTwice", fileOf(R"({"__metadata__": {"k": "a", "k": "b"}})"),
       {"header gives key 'k' twice (in '__metadata__')"}},
      {"NestedTooDeep", fileOf(R"({"__metadata__": {"k": )" + deep + "}}"), {"header nests", "deeper than 64 levels"}},
      {"EntryNotAnObject", fileOf(one("[0, 48]"), w48), {"tensor 'w': entry is a list, not an object"}},
      {"EntryWithoutDtype", fileOf(one(R"({"shape": [3, 4], "data_offsets": [0, 48]})"), w48),
       {"tensor 'w': has no \"dtype\""}},
      {"EntryWithoutShape", fileOf(one(R"({"dtype": "F32", "data_offsets": [0, 48]})"), w48),
       {"tensor 'w': has no \"shape\""}},
      {"EntryWithoutOffsets", fileOf(one(R"({"dtype": "F32", "shape": [3, 4]})"), w48),
       {"tensor 'w': has no \"data_offsets\""}},
      {"EntryWithAnotherKey",
       fileOf(one(R"({"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48], "strides": [4, 1]})"), w48),
       {"tensor 'w': unexpected key 'strides'"}},
      {"DtypeNotAString", fileOf(one(R"({"dtype": 4, "shape": [3, 4], "data_offsets": [0, 48]})"), w48),
       {"tensor 'w': dtype is 4, not a string"}},
      {"UnknownDtype", fileOf(one(R"({"dtype": "F33", "shape": [3, 4], "data_offsets": [0, 48]})"), w48),
       {"tensor 'w': unknown dtype 'F33'; valid: F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, "
        "U32, U16, U8, BOOL"}},
      {"ShapeNotAList", fileOf(withShape("12"), w48), {"tensor 'w': shape is 12, not a list of non-negative integers"}},
      {"ShapeNegative", fileOf(withShape("[3, -4]"), w48), {"tensor 'w': shape[1] is -4, not a non-negative integer"}},
      {"ShapeMinusZero", fileOf(withShape("[-0, 4]"), w48), {"tensor 'w': shape[0] is -0, not a non-negative integer"}},
      {"ShapeFloat", fileOf(withShape("[3, 4.0]"), w48), {"tensor 'w': shape[1] is 4.0, not a non-negative integer"}},
      {"ShapeString", fileOf(withShape(R"(["3", 4])"), w48), {"tensor 'w': shape[0] is the string '3'"}},
      {"ShapeAboveInt64", fileOf(withShape("[9223372036854775808]"), w48),
       {"tensor 'w': shape[0] is 9223372036854775808, above 2^63 - 1"}},
      {"ShapeElementCountOverflows", fileOf(withShape("[4294967296, 4294967296]"), w48),
       {"tensor 'w': shape [4294967296, 4294967296] of F32 overflows"}},
      {"ShapeByteCountOverflows", fileOf(withShape("[4611686018427387904]"), w48),
       {"tensor 'w': shape [4611686018427387904] of F32 overflows"}},
      {"OffsetsNotAList", fileOf(withOffsets("0"), w48),
       {"tensor 'w': data_offsets is 0, not two non-negative integers [begin, end]"}},
      {"OffsetsThreeValues", fileOf(withOffsets("[0, 48, 48]"), w48), {"tensor 'w': data_offsets is a list of 3 values"}},
      {"OffsetNegative", fileOf(withOffsets("[-1, 47]"), w48), {"tensor 'w': data_offsets[0] is -1"}},
      {"OffsetFloat", fileOf(withOffsets("[0, 48.0]"), w48), {"tensor 'w': data_offsets[1] is 48.0"}},
      {"OffsetsBeginAfterEnd", fileOf(withOffsets("[48, 0]"), w48), {"tensor 'w': data_offsets [48, 0] begin after"}},
      {"OffsetsBeyondTheBuffer", fileOf(withOffsets("[0, 96]"), w48),
       {"tensor 'w': data_offsets [0, 96] end beyond the data buffer of 48 bytes"}},
      {"OffsetNear2To64", fileOf(withOffsets("[18446744073709551584, 18446744073709551615]"), w48),
       {"end beyond the data buffer of 48 bytes"}},
      {"SizeDoesNotMatchShape",
       fileOf(R"({"layers.0.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}})", std::string(40, 0)),
       {"w.safetensors: tensor 'layers.0.weight': data_offsets [0, 40] hold 40 bytes but shape [3, 4] of F32 needs 48"}},
      {"RangesOverlap",
       fileOf(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
              R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
              std::string(24, 0)),
       {"tensors 'a' [0, 16] and 'b' [8, 24] overlap"}},
      {"HoleBetweenRanges",
       fileOf(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
              R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}})",
              std::string(40, 0)),
       {"data buffer bytes [16, 24) belong to no tensor (a hole between 'a' [0, 16] and 'b' [24, 40])"}},
      {"HoleBeforeTheFirstRange", fileOf(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                                         std::string(24, 0)),
       {"data buffer bytes [0, 8) belong to no tensor (a hole before 'a' [8, 24])"}},
      {"BytesAfterTheLastRange",
       fileOf(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", std::string(20, 0)),
       {"data buffer has 4 bytes after the last tensor 'a' [0, 16]"}},
      {"BytesWithoutTensors", fileOf("{}", std::string(8, 0)), {"data buffer has 8 bytes after a header listing no tensor"}},
      {"MetadataNotAnObject", fileOf(R"({"__metadata__": "pt"})"),
       {"__metadata__ is the string 'pt', not an object of strings"}},
      {"MetadataNull", fileOf(R"({"__metadata__": null})"), {"__metadata__ is null, not an object of strings"}},
      {"MetadataValueNotAString", fileOf(R"({"__metadata__": {"step": 12}})"),
       {"__metadata__ 'step' is 12, not a string"}},
  };
}

class BadFileTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadFileTest, IsRejectedWithItsReason) {
  const std::string m = formatErrorOf([] { File::parse(GetParam().bytes, "w.safetensors"); });
  EXPECT_EQ(m.rfind("w.safetensors: ", 0), 0u) << m;
  for (const std::string& part : GetParam().expected) EXPECT_NE(m.find(part), std::string::npos) << m;
  EXPECT_TRUE(printableAscii(m)) << m;
}

INSTANTIATE_TEST_SUITE_P(Safetensors, BadFileTest, ::testing::ValuesIn(badFiles()),
                         [](const ::testing::TestParamInfo<BadFile>& info) { return std::string(info.param.name); });

// readMetadata reads the header alone, with the same checks: every bad file above gives File's
// message, and a good file's metadata comes back whole.
TEST(Safetensors, ReadMetadataChecksTheHeaderAsReadDoes) {
  TempDir dir;
  const fs::path path = dir.path() / "m.safetensors";
  for (const BadFile& bad : badFiles()) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad.bytes;
    const std::string whole = formatErrorOf([&] { File::read(path.string()); });
    const std::string header = formatErrorOf([&] { readMetadata(path.string()); });
    EXPECT_EQ(header, whole) << bad.name;
  }
  const Metadata meta = {{"step", "12"}, {"config", "name: x\n"}};
  write(path.string(), {Tensor::f32("w", {3, 4}, std::vector<float>(12, 1.0f)), Tensor::i64("n", {1}, {7})}, meta);
  EXPECT_EQ(readMetadata(path.string()), meta);
  fs::resize_file(path, fs::file_size(path) - 1);  // the data, not the header, is cut: still found
  EXPECT_NE(formatErrorOf([&] { readMetadata(path.string()); }).find("end beyond the data buffer"), std::string::npos);
}

TEST(Safetensors, ReadChecksADamagedFileOnDisk) {
  TempDir dir;
  const fs::path path = dir.path() / "cut.safetensors";
  const std::string good = serialize({Tensor::f32("w", {3, 4}, std::vector<float>(12, 1.0f))}, {});
  std::ofstream(path, std::ios::binary) << good.substr(0, good.size() - 1);
  const std::string m = formatErrorOf([&] { File::read(path.string()); });
  EXPECT_NE(m.find(path.string() + ": tensor 'w': data_offsets [0, 48] end beyond the data buffer of 47 bytes"),
            std::string::npos)
      << m;
}

TEST(SafetensorsAtomicWrite, ReplacesTheFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = (dir.path() / "w.safetensors").string();
  write(path, {Tensor::f32("a", {1}, {1})}, {{"version", "1"}});
  write(path, {Tensor::f32("a", {2}, {1, 2})}, {{"version", "2"}});
  EXPECT_EQ(File::read(path).metadata().at("version"), "2");
  EXPECT_EQ(temporariesIn(dir.path()), std::vector<std::string>{});
  // A bare file name (no folder part) is written in the current folder.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  writeFileAtomically("bare.bin", "xyz");
  fs::current_path(cwd);
  EXPECT_EQ(readBytes(dir.path() / "bare.bin"), "xyz");
}

TEST(SafetensorsAtomicWrite, MissingFolderFailsCleanly) {
  TempDir dir;
  const std::string path = (dir.path() / "absent" / "w.safetensors").string();
  const std::string m = formatErrorOf([&] { write(path, {Tensor::f32("a", {1}, {1})}, {}); });
  EXPECT_EQ(m, path + ": cannot write: No such file or directory");
  try {
    writeFileAtomically(path, "x");
    ADD_FAILURE() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot write: No such file or directory");
  }
  EXPECT_THROW(syncFolder((dir.path() / "absent").string()), UserError);
  EXPECT_FALSE(fs::exists(dir.path() / "absent"));
}

TEST(SafetensorsAtomicWrite, TargetThatIsAFolderIsLeftAloneWithoutTemporary) {
  TempDir dir;
  const fs::path target = dir.path() / "w.safetensors";
  fs::create_directories(target / "inside");
  const std::string m = formatErrorOf([&] { write(target.string(), {Tensor::f32("a", {1}, {1})}, {}); });
  EXPECT_NE(m.find(target.string() + ": cannot write: "), std::string::npos) << m;
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  EXPECT_EQ(temporariesIn(dir.path()), std::vector<std::string>{});
}

TEST(SafetensorsAtomicWrite, UnwritableFolderKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which writes into any folder (MissingFolderFailsCleanly covers the failure path)";
  TempDir dir;
  const fs::path path = dir.path() / "w.safetensors";
  write(path.string(), {Tensor::f32("a", {1}, {1})}, {{"version", "old"}});
  const std::string before = readBytes(path);
  fs::permissions(dir.path(), fs::perms::owner_read | fs::perms::owner_exec);
  const std::string m = formatErrorOf([&] { write(path.string(), {Tensor::f32("a", {1}, {2})}, {{"version", "new"}}); });
  fs::permissions(dir.path(), fs::perms::owner_all);
  EXPECT_EQ(m, path.string() + ": cannot write: Permission denied");
  EXPECT_EQ(readBytes(path), before);
  EXPECT_EQ(temporariesIn(dir.path()), std::vector<std::string>{});
}

// A full disk, simulated by a file size limit in a child process: write(2) then fails with EFBIG
// part way (SIGXFSZ ignored, else it would kill the child).
TEST(SafetensorsAtomicWrite, FullDiskKeepsTheOldFile) {
  TempDir dir;
  const fs::path path = dir.path() / "w.safetensors";
  write(path.string(), {Tensor::f32("a", {2}, {1, 2})}, {{"version", "old"}});
  const std::string before = readBytes(path);
  const std::vector<Tensor> big = {Tensor::f64("big", {8192}, std::vector<double>(8192, 1.0))};  // 64 KiB

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Exit codes: 0 both writes failed as they should, 1 a write went through, 2 a wrong
    // message, 3 another exception.
    struct rlimit limit = {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::signal(SIGXFSZ, SIG_IGN);
    int code = 0;
    try {
      writeFileAtomically(path.string(), std::string(65536, 'x'));
      code = 1;
    } catch (const UserError& e) {
      if (std::string(e.what()) != path.string() + ": cannot write: File too large") code = 2;
    } catch (...) {
      code = 3;
    }
    try {
      write(path.string(), big, {{"version", "new"}});
      code = code ? code : 1;
    } catch (const FormatError& e) {
      if (std::string(e.what()) != path.string() + ": cannot write: File too large") code = code ? code : 2;
    } catch (...) {
      code = code ? code : 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: a write went through, 2: a wrong message, 3: another exception";
  EXPECT_EQ(readBytes(path), before);
  EXPECT_EQ(File::read(path.string()).metadata().at("version"), "old");
  EXPECT_EQ(temporariesIn(dir.path()), std::vector<std::string>{});
}

// Interoperability with the reference implementation's Python package, both ways; skipped
// where python3 lacks numpy or safetensors.
TEST(SafetensorsInterop, PythonReadsOursAndWeReadTheirs) {
  if (std::system("python3 -c 'import numpy, safetensors.numpy' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with numpy and safetensors not found (python3 -m pip install numpy safetensors)";
  TempDir dir;
  write((dir.path() / "ours.safetensors").string(),
        {Tensor::f32("w", {2, 3}, {1, 2, 3, 4, 5, 6.5f}), Tensor::i64("steps", {3}, {-1, 0, 1LL << 40}),
         Tensor::fromDoubles("h", DType::F16, {2}, {0.5, -1.5}), Tensor::f64("s", {}, {2.25}),
         Tensor::f32("e", {0, 4}, {})},
        {{"format", "np"}, {"step", "7"}});
  std::ofstream(dir.path() / "check.py") << R"(import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
t = load_file(d + "/ours.safetensors")
assert t["w"].dtype == np.float32 and t["w"].tolist() == [[1, 2, 3], [4, 5, 6.5]], t["w"]
assert t["steps"].dtype == np.int64 and t["steps"].tolist() == [-1, 0, 1 << 40], t["steps"]
assert t["h"].dtype == np.float16 and t["h"].tolist() == [0.5, -1.5], t["h"]
assert t["s"].shape == () and float(t["s"]) == 2.25, t["s"]
assert t["e"].shape == (0, 4), t["e"].shape
with safe_open(d + "/ours.safetensors", "np") as f:
    assert f.metadata() == {"format": "np", "step": "7"}, f.metadata()
save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], dtype=np.int64),
           "h": np.array([0.25, -3], dtype=np.float16), "e": np.zeros((0, 2), dtype=np.float64),
           "s": np.array(1.5, dtype=np.float64)}, d + "/theirs.safetensors", metadata={"source": "python"})
)";
  const std::string command = "python3 " + (dir.path() / "check.py").string() + " " + dir.path().string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const File f = File::read((dir.path() / "theirs.safetensors").string());
  EXPECT_EQ(f.metadata(), (Metadata{{"source", "python"}}));
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.find("a")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.toDoubles(*f.find("a")), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(f.toInt64(*f.find("b")), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(f.toDoubles(*f.find("h")), (std::vector<double>{0.25, -3}));
  EXPECT_EQ(f.find("e")->shape, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(f.find("s")->shape, std::vector<int64_t>{});
  EXPECT_EQ(f.toDoubles(*f.find("s")), (std::vector<double>{1.5}));
}

// Note on the fuzzer. Valid files (several dtypes, metadata, empty tensors, no tensors) are
// mutated blindly (bit flips, bytes, cuts, insertions, the header length) and with edits that
// know the format (dtypes, numbers in shapes and offsets, duplicated keys, deep nesting, swapped
// ranges), so that mutants get past the JSON parser and reach each later check. Every mutant must
// parse or throw FormatError; one that parses must be consistent.
class Mutator {
public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string mutate(std::string file) {
    const int edits = 1 + static_cast<int>(below(3));
    for (int i = 0; i < edits; ++i) file = once(file);
    return file;
  }

private:
  std::mt19937_64 rng_;

  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

  static uint64_t headerLength(const std::string& file) {
    uint64_t n = 0;
    for (int i = 0; i < 8 && i < static_cast<int>(file.size()); ++i) n |= uint64_t{static_cast<uint8_t>(file[i])} << (8 * i);
    return n;
  }

  // Every position where `needle` starts in `s`.
  static std::vector<size_t> findAll(const std::string& s, const std::string& needle) {
    std::vector<size_t> at;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) at.push_back(p);
    return at;
  }

  std::string once(const std::string& file) {
    const uint64_t n = headerLength(file);
    if (file.size() < 8 || n > file.size() - 8) return bytewise(file);
    std::string header = file.substr(8, n), buffer = file.substr(8 + n);
    switch (below(3)) {
    case 0: return bytewise(file);
    case 1: header = jsonEdit(header); break;
    case 2: buffer = bufferEdit(buffer); break;
    }
    // Mostly a consistent length, so the edit reaches the checks after the header's framing.
    return (below(10) ? le(header.size(), 8) : file.substr(0, 8)) + header + buffer;
  }

  std::string bytewise(std::string f) {
    switch (below(6)) {
    case 0:
      for (size_t i = 0, k = 1 + below(4); i < k && !f.empty(); ++i) f[below(f.size())] ^= static_cast<char>(1 << below(8));
      return f;
    case 1:
      if (!f.empty()) f[below(f.size())] = static_cast<char>(rng_());
      return f;
    case 2: return f.substr(0, below(f.size() + 1));
    case 3: {
      std::string ins;
      for (size_t i = 0, k = 1 + below(16); i < k; ++i) ins += static_cast<char>(rng_());
      return f.insert(below(f.size() + 1), ins);
    }
    case 4: {
      const size_t at = below(f.size() + 1);
      return f.erase(at, 1 + below(16));
    }
    case 5: {
      const uint64_t n = headerLength(f);
      const std::vector<uint64_t> lengths = {0, 1, n - 1, n + 1, n + 8, f.size() - 8, f.size() - 7,
                                             100000000, 100000001, uint64_t{1} << 63, ~uint64_t{0}, rng_()};
      std::string out = le(pick(lengths), 8);
      return f.size() > 8 ? out + f.substr(8) : out;
    }
    }
    return f;
  }

  std::string bufferEdit(std::string b) {
    switch (below(3)) {
    case 0:
      if (!b.empty()) b[below(b.size())] = static_cast<char>(rng_());  // still valid: other values
      return b;
    case 1: return b + std::string(1 + below(9), '\0');
    case 2: return b.substr(0, b.size() - std::min(b.size(), 1 + below(9)));
    }
    return b;
  }

  std::string jsonEdit(std::string h) {
    if (h.empty()) return "{";
    switch (below(12)) {
    case 0: {  // another dtype, known or not
      const std::vector<size_t> at = findAll(h, "\"dtype\":\"");
      if (at.empty()) return h;
      const size_t from = pick(at) + 9, to = h.find('"', from);
      static const std::vector<std::string> names = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64",
                                                     "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
                                                     "F33", "", "f32", "C64", "F8_E8M0", "F32 "};
      return h.replace(from, to - from, pick(names));
    }
    case 1: {  // another number, or a value of another kind where a number was
      std::vector<std::pair<size_t, size_t>> numbers;
      for (size_t i = 0; i < h.size(); ++i)
        if (std::isdigit(static_cast<unsigned char>(h[i]))) {
          size_t j = i;
          while (j < h.size() && std::isdigit(static_cast<unsigned char>(h[j]))) ++j;
          numbers.push_back({i, j - i});
          i = j;
        }
      if (numbers.empty()) return h;
      static const std::vector<std::string> values = {
          "0", "1", "2", "4", "8", "16", "24", "-1", "-0", "4294967296", "9223372036854775807", "9223372036854775808",
          "18446744073709551615", "18446744073709551616", "1e300", "0.5", "4.0", "\"8\"", "null", "true", "[]", "{}",
          "[0,0]"};
      const auto [at, len] = pick(numbers);
      return h.replace(at, len, below(4) ? pick(values) : std::to_string(below(64)));
    }
    case 2: {  // a top-level key twice: copy an entry (none has nested objects) to the front
      const std::vector<size_t> at = findAll(h, "\":{");
      if (at.empty()) return h;
      const size_t p = pick(at), start = h.rfind('"', p - 1), end = h.find('}', p);
      if (start == std::string::npos || end == std::string::npos) return h;
      return h.insert(1, h.substr(start, end + 1 - start) + ",");
    }
    case 3: {  // a key twice inside an entry, or an extra key
      const std::vector<size_t> at = findAll(h, "\":{");
      if (at.empty()) return h;
      return h.insert(pick(at) + 3, below(2) ? "\"dtype\":\"F32\"," : "\"extra\":1,");
    }
    case 4: {  // deep nesting in place of a value
      const std::vector<size_t> at = findAll(h, ":");
      if (at.empty()) return h;
      static const std::vector<size_t> depths = {10, 63, 64, 65, 200, 5000};
      const size_t depth = pick(depths), p = pick(at) + 1;
      std::string nest;
      if (below(2)) {
        nest = std::string(depth, '[') + "0" + std::string(depth, ']');
      } else {
        for (size_t i = 0; i < depth; ++i) nest += "{\"a\":";
        nest += "0" + std::string(depth, '}');
      }
      return h.insert(p, nest + ",\"z\":");
    }
    case 5: {  // swap two tensors' ranges: valid when their sizes agree, overlapping or holed otherwise
      std::vector<std::pair<size_t, size_t>> ranges;
      for (size_t p : findAll(h, "\"data_offsets\":[")) ranges.push_back({p + 16, h.find(']', p) - (p + 16)});
      if (ranges.size() < 2) return h;
      size_t i = below(ranges.size()), j = below(ranges.size());
      if (i == j) return h;
      if (ranges[i].first > ranges[j].first) std::swap(i, j);
      const std::string a = h.substr(ranges[i].first, ranges[i].second), b = h.substr(ranges[j].first, ranges[j].second);
      h.replace(ranges[j].first, ranges[j].second, a);
      return h.replace(ranges[i].first, ranges[i].second, b);
    }
    case 6: {  // a metadata value that is not a string, or metadata that is not an object
      const std::vector<size_t> at = findAll(h, "\"__metadata__\":");
      static const std::vector<std::string> values = {"\"n\":5,", "\"n\":null,", "\"n\":{\"a\":\"b\"},", "\"n\":[\"x\"],"};
      if (at.empty()) return h.insert(1, "\"__metadata__\":" + std::string(below(2) ? "7," : "{\"k\":\"v\"},"));
      const size_t value = at[0] + 15;  // inside the object when it is one
      return h.insert(value + (value < h.size() && h[value] == '{' ? 1 : 0), pick(values));
    }
    case 7: {  // JSON punctuation and escapes where they do not belong
      static const std::vector<std::string> bits = {",", "}", "{", "]", "[", "\"", ":", "\\", "\\u0000", "\\ud800", " "};
      return h.insert(below(h.size() + 1), pick(bits));
    }
    case 8: {  // rename a tensor: names may collide
      const std::vector<size_t> at = findAll(h, "\":{");
      if (at.empty() || at[0] < 2) return h;
      h[pick(at) - 1] = static_cast<char>('a' + below(3));
      return h;
    }
    case 9: {  // move a range, its size kept: a hole, an overlap, or past the end
      const std::vector<size_t> at = findAll(h, "\"data_offsets\":[");
      if (at.empty()) return h;
      const size_t from = pick(at) + 16, to = h.find(']', from);
      unsigned long long begin = 0, end = 0;
      if (to == std::string::npos || std::sscanf(h.c_str() + from, "%llu,%llu", &begin, &end) != 2) return h;
      static const std::vector<long long> shifts = {-16, -8, -4, -2, -1, 1, 2, 4, 8, 16};
      const long long by = pick(shifts);
      if (by < 0 && begin < static_cast<unsigned long long>(-by)) return h;
      return h.replace(from, to - from, std::to_string(begin + by) + "," + std::to_string(end + by));
    }
    case 11: {  // an entry without its shape
      const std::vector<size_t> at = findAll(h, "\"shape\":[");
      if (at.empty()) return h;
      const size_t from = pick(at), to = h.find("],", from);
      return to == std::string::npos ? h : h.erase(from, to + 2 - from);
    }
    case 10: {  // a header that is JSON but not an object
      static const std::vector<std::string> wrappers = {"[", "\"", "7,", "null,"};
      const std::string w = pick(wrappers);
      return w == "\"" ? "\"header\"" : w == "[" ? "[" + h + "]" : w.substr(0, w.size() - 1);
    }
    }
    return h;
  }
};

std::vector<std::string> fuzzSeeds() {
  std::mt19937_64 rng(3);
  const auto raw = [&rng](const std::string& name, DType d, std::vector<int64_t> shape) {
    Tensor t;
    t.name = name;
    t.dtype = d;
    t.shape = std::move(shape);
    int64_t numel = 1;
    for (int64_t x : t.shape) numel *= x;
    t.bytes = randomBytes(rng, static_cast<size_t>(numel) * dtypeSize(d));
    return t;
  };
  return {
      serialize({Tensor::f32("w", {2, 3}, {1, 2, 3, 4, 5, 6}), Tensor::i64("i", {4}, {1, -2, 3, -4}),
                 Tensor::u64("u", {2}, {1, ~uint64_t{0}}), Tensor::fromDoubles("b", DType::BF16, {3}, {1, 2, 3}),
                 Tensor::fromDoubles("h", DType::F16, {2, 2}, {0.5, 1, 2, 4}), raw("e4", DType::F8_E4M3, {5}),
                 raw("e5", DType::F8_E5M2, {3}), raw("m", DType::Bool, {2}), Tensor::f64("empty", {0, 3}, {}),
                 Tensor::f64("scalar", {}, {2.5})},
                {{"format", "pt"}, {"note", "\xce\xbc"}}),
      serialize({raw("i8", DType::I8, {7}), raw("u8", DType::U8, {1}), raw("i16", DType::I16, {3}),
                 raw("u16", DType::U16, {2}), raw("i32", DType::I32, {2}), raw("u32", DType::U32, {1}),
                 raw("f64", DType::F64, {2}), raw("f32", DType::F32, {2})},
                {}),
      serialize({}, {{"a", "b"}}),
      serialize({Tensor::f32("z", {0}, {}), Tensor::i64("y", {2, 0}, {})}, {}),
  };
}

// What a file that parsed must satisfy: "" or the first inconsistency.
std::string inconsistency(const File& f, const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  const size_t bufferSize = bytes.size() - 8 - n;
  size_t pos = 0;
  for (const TensorInfo& t : f.tensors()) {
    const std::string where = "tensor '" + t.name + "': ";
    if (t.begin != pos || t.end < t.begin || t.end > bufferSize) return where + "range does not tile the buffer";
    if (static_cast<size_t>(t.numel()) * dtypeSize(t.dtype) != t.end - t.begin) return where + "size";
    if (f.find(t.name) != &t) return where + "find";
    if (std::memcmp(f.data(t), bytes.data() + 8 + n + t.begin, t.end - t.begin) != 0) return where + "data";
    pos = t.end;
    try {
      if (isFloat(t.dtype) && f.toDoubles(t).size() != static_cast<size_t>(t.numel())) return where + "toDoubles";
      if (!isFloat(t.dtype)) {
        EXPECT_THROW(f.toDoubles(t), FormatError);
        if (t.dtype == DType::U64 && f.toUint64(t).size() != static_cast<size_t>(t.numel())) return where + "toUint64";
        if (t.dtype == DType::I64 && f.toInt64(t).size() != static_cast<size_t>(t.numel())) return where + "toInt64";
        if (t.dtype == DType::U64) f.toInt64(t);
      }
    } catch (const FormatError&) {
      if (t.dtype != DType::U64) return where + "conversion threw";
    }
  }
  return pos == bufferSize ? "" : "bytes after the last tensor";
}

TEST(SafetensorsFuzz, RandomMutationsNeverCrash) {
  const std::vector<std::string> seeds = fuzzSeeds();
  for (const std::string& s : seeds) ASSERT_NO_THROW(File::parse(s, "seed"));
  Mutator mutator(20240601);
  constexpr int kCases = 12000;
  int valid = 0, invalid = 0, failures = 0;
  // Which checks the mutants reached, by a phrase of their messages.
  const std::vector<std::string> phrases = {"truncated", "header length", "not valid JSON", "not a JSON object",
                                            "twice", "deeper than", "has no", "unexpected key", "unknown dtype",
                                            "shape", "data_offsets", "overlap", "hole", "after", "__metadata__"};
  std::map<std::string, int> reached;
  for (int i = 0; i < kCases && failures < 5; ++i) {
    const std::string bytes = mutator.mutate(seeds[static_cast<size_t>(i) % seeds.size()]);
    try {
      const File f = File::parse(bytes, "fuzz");
      ++valid;
      const std::string problem = inconsistency(f, bytes);
      if (!problem.empty()) {
        ADD_FAILURE() << "case " << i << " parsed but " << problem;
        ++failures;
      }
    } catch (const FormatError& e) {
      ++invalid;
      const std::string m = e.what();
      if (m.rfind("fuzz: ", 0) != 0 || !printableAscii(m)) {
        ADD_FAILURE() << "case " << i << ": message without the file name, or unprintable: " << m;
        ++failures;
      }
      for (const std::string& p : phrases)
        if (m.find(p) != std::string::npos) ++reached[p];
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << ": not a FormatError: " << e.what();
      ++failures;
    }
  }
  std::cout << "fuzz: " << valid << " valid, " << invalid << " invalid of " << kCases << "; messages by phrase:";
  for (const auto& [p, count] : reached) std::cout << " [" << p << "] " << count;
  std::cout << "\n";
  EXPECT_GT(valid, kCases / 20);
  EXPECT_GT(invalid, kCases / 2);
  for (const std::string& p : phrases) EXPECT_GT(reached[p], 0) << "no mutant reached the check for '" << p << "'";
}

}  // namespace
}  // namespace pa::safetensors
