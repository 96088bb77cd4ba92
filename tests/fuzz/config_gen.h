// The config fuzzer's cases: a valid model (one of configs/*.yaml shrunk to a tiny size, or one
// from a small generator of linear, attention and explicit-graph models over sine, function and
// CSV data), then a few mutations of its YAML tree, its text, its CSV file or its `--set` flags.
// Case i of seed s is a pure function of (s, i): the same seed always gives the same configs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/fuzz/yaml_tree.h"

namespace pa::fuzz {

// The folder a case runs in; `train`'s arguments name it with this placeholder.
inline constexpr const char* kDirToken = "{DIR}";

struct FuzzCase {
  uint64_t index = 0;
  std::string origin;                                     // which seed model it started from
  std::string yaml;                                       // written as {DIR}/config.yaml
  std::vector<std::pair<std::string, std::string>> files;  // more files in {DIR} (name, content)
  std::vector<std::string> args;                          // `train`'s arguments
  std::vector<std::string> mutations;                     // what was changed; empty: a valid config
};

struct SeedConfig {
  std::string name;
  YNode tree;
};

// configs/*.yaml in name order, every size shrunk so that a step takes well under a millisecond.
std::vector<SeedConfig> loadSeedConfigs(const std::string& configDir);

class CaseGenerator {
 public:
  CaseGenerator(uint64_t seed, std::vector<SeedConfig> seeds) : seed_(seed), seeds_(std::move(seeds)) {}
  FuzzCase make(uint64_t index) const;

 private:
  uint64_t seed_;
  std::vector<SeedConfig> seeds_;
};

// Splitmix64: small, fast and the same on every platform (std distributions are not).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(static_cast<size_t>(hi - lo + 1))); }
  bool percent(int p) { return static_cast<int>(below(100)) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }
};

}  // namespace pa::fuzz
