// The GEMM autotune cache's file (runtime/autotune_cache.h) without a GPU: the JSON round trip,
// and files that are corrupt, of an old format or version, unreadable, or with broken entries,
// which are ignored (or their entries dropped) with a note, never a crash. Each test keeps its
// files in a directory of its own, so that tests can run in parallel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/autotune_cache.h"

namespace pa {
namespace {

namespace fs = std::filesystem;

class AutotuneCacheTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "pa-autotune-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name = "gemm-autotune.json") const { return (fs::path(dir_) / name).string(); }
  void write(const std::string& file, const std::string& text) const { std::ofstream(file, std::ios::binary) << text; }
  static std::string read(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

AutotuneEntry generated() { return AutotuneEntry{}; }
AutotuneEntry cublaslt(const std::string& algo, bool transposedB) {
  AutotuneEntry e;
  e.kind = AutotuneEntry::Kind::Cublaslt, e.algo = algo, e.transposedB = transposedB;
  return e;
}
AutotuneEntry tiles(int index) {
  AutotuneEntry e;
  e.kind = AutotuneEntry::Kind::Tiles, e.tiles = index;
  return e;
}

TEST_F(AutotuneCacheTest, SerialiseAndParseRoundTrip) {
  const std::map<std::string, AutotuneEntry> entries = {
      {"H100|132|lt120000|auto|8192x1024x1024 NN|post0|gen1a2b", generated()},
      {"H100|132|lt120000|cublaslt|256x256x8192 TN|post1|gen3c4d", cublaslt("0a1b2c3d", false)},
      {"key with \"quotes\", tabs\tand a newline\n", cublaslt("ff", true)},
      {"H100|132|tiles|9e8f", tiles(2)}};
  std::string why;
  const auto parsed = AutotuneCache::parse(AutotuneCache::serialise(entries), why);
  ASSERT_TRUE(parsed) << why;
  EXPECT_EQ(*parsed, entries);
}

TEST_F(AutotuneCacheTest, PutPersistsAcrossInstances) {
  {
    AutotuneCache cache(path());
    EXPECT_FALSE(cache.find("a"));
    cache.put("a", cublaslt("abcd", true));
    cache.put("b", tiles(1));
    cache.put("a", generated());  // a new measurement replaces the old one
  }
  AutotuneCache again(path());
  ASSERT_TRUE(again.find("a"));
  EXPECT_EQ(*again.find("a"), generated());
  ASSERT_TRUE(again.find("b"));
  EXPECT_EQ(*again.find("b"), tiles(1));
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary file left behind
    EXPECT_EQ(e.path().filename(), "gemm-autotune.json");
}

TEST_F(AutotuneCacheTest, WritesKeepWhatAnotherProcessAdded) {
  AutotuneCache first(path()), second(path());
  first.put("from-first", tiles(3));
  second.put("from-second", generated());
  AutotuneCache reader(path());
  EXPECT_TRUE(reader.find("from-first"));
  EXPECT_TRUE(reader.find("from-second"));
}

TEST_F(AutotuneCacheTest, CorruptFileIsIgnoredWithANoteAndRewritten) {
  for (const std::string& text : {std::string("{\"format\": \"pureattention-gemm-autotune\", \"version\": 2, \"entr"),
                                  std::string("\x00\xff\xfe garbage", 11), std::string()}) {
    write(path(), text);
    testing::internal::CaptureStderr();
    AutotuneCache cache(path());
    const std::string note = testing::internal::GetCapturedStderr();
    EXPECT_NE(note.find("ignored"), std::string::npos) << note;
    EXPECT_EQ(std::count(note.begin(), note.end(), '\n'), 1) << note;  // one line
    EXPECT_FALSE(cache.find("anything"));
    cache.put("k", tiles(0));
    std::string why;
    const auto parsed = AutotuneCache::parse(read(path()), why);
    ASSERT_TRUE(parsed) << why;
    EXPECT_EQ(parsed->size(), 1u);
  }
}

TEST_F(AutotuneCacheTest, OldFormatsAndOtherVersionsAreIgnored) {
  const std::string v1 = "H100|132|tiles|9e8f\ttiles 2\nH100|132|lt1|auto|x\tcublaslt 0a1b\n";  // the tab-separated v1 file
  const std::string v3 = R"({"format": "pureattention-gemm-autotune", "version": 3, "entries": {"k": {"tiles": 1}}})";
  const std::string other = R"({"format": "something-else", "version": 2, "entries": {}})";
  const std::string list = R"([1, 2, 3])";
  const std::string mistyped = R"({"format": 5, "version": "2", "entries": []})";
  const std::string noEntries = R"({"format": "pureattention-gemm-autotune", "version": 2})";
  for (const std::string& text : {v1, v3, other, list, mistyped, noEntries}) {
    std::string why;
    EXPECT_FALSE(AutotuneCache::parse(text, why)) << text;
    EXPECT_FALSE(why.empty());
    write(path(), text);
    testing::internal::CaptureStderr();
    AutotuneCache cache(path());
    EXPECT_NE(testing::internal::GetCapturedStderr().find("ignored"), std::string::npos) << text;
    EXPECT_FALSE(cache.find("k"));
  }
}

TEST_F(AutotuneCacheTest, EntriesWithMissingOrMistypedFieldsAreDropped) {
  const std::string text = R"({"format": "pureattention-gemm-autotune", "version": 2, "entries": {
    "good-generated": {"provider": "generated"},
    "good-library": {"provider": "cublaslt", "algo": "0a", "transposed_b": false},
    "good-tiles": {"tiles": 2},
    "no-algo": {"provider": "cublaslt", "transposed_b": false},
    "no-transpose": {"provider": "cublaslt", "algo": "0a"},
    "algo-number": {"provider": "cublaslt", "algo": 10, "transposed_b": false},
    "unknown-provider": {"provider": "magic"},
    "no-provider": {},
    "tiles-string": {"tiles": "2"},
    "tiles-negative": {"tiles": -1},
    "not-an-object": "generated"}})";
  std::string why;
  const auto parsed = AutotuneCache::parse(text, why);
  ASSERT_TRUE(parsed) << why;
  EXPECT_EQ(parsed->size(), 3u);
  EXPECT_TRUE(parsed->count("good-generated") && parsed->count("good-library") && parsed->count("good-tiles"));
  EXPECT_EQ(parsed->at("good-library"), cublaslt("0a", false));
  EXPECT_EQ(parsed->at("good-tiles"), tiles(2));
}

TEST_F(AutotuneCacheTest, UnreadableFileIsIgnoredAndWritesDoNotThrow) {
  fs::create_directories(path());  // a directory where the file should be
  testing::internal::CaptureStderr();
  AutotuneCache cache(path());
  EXPECT_NE(testing::internal::GetCapturedStderr().find("ignored"), std::string::npos);
  EXPECT_NO_THROW(cache.put("k", tiles(1)));
  ASSERT_TRUE(cache.find("k"));  // still kept for the process
  EXPECT_EQ(*cache.find("k"), tiles(1));
}

TEST_F(AutotuneCacheTest, WithoutAFileTheCacheLivesInMemory) {
  AutotuneCache cache("");
  cache.put("k", cublaslt("beef", false));
  ASSERT_TRUE(cache.find("k"));
  EXPECT_EQ(cache.find("k")->algo, "beef");
  EXPECT_TRUE(fs::is_empty(dir_));
}

}  // namespace
}  // namespace pa
