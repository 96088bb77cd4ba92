// The GEMM autotuner's cache: measured choices (provider and cuBLASLt algorithm, or the tile
// variant) by key, kept for the process and in a JSON file beside the kernel cache.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace pa {

// One cached choice.
struct AutotuneEntry {
  enum class Kind { Generated, Cublaslt, Tiles };
  Kind kind = Kind::Generated;
  std::string algo;          // Cublaslt: the algorithm (cuda::LtAlgo::hex())
  bool transposedB = false;  // Cublaslt: run on an untransposed copy of B
  int tiles = 0;             // Tiles: the winning tile variant (0: the emitter's pick)
  bool operator==(const AutotuneEntry& o) const {
    return kind == o.kind && algo == o.algo && transposedB == o.transposedB && tiles == o.tiles;
  }
};

// Note on the autotune cache. A choice is keyed by everything that can change it (the runner
// builds the keys: device, SM count, cuBLASLt's version, provider mode, the problem, a hash of
// the generated kernels' source). The file is one JSON object,
//   {"format": "pureattention-gemm-autotune", "version": 2,
//    "entries": {KEY: {"provider": "generated"} | {"provider": "cublaslt", "algo": HEX,
//                "transposed_b": BOOL} | {"tiles": N}, ...}},
// rewritten whole (through a temporary file and a rename) on every new entry, merged with what
// another process wrote meanwhile. A file that cannot be read or parsed, or of another format or
// version, is ignored with a one-line note on stderr and replaced at the next write; an entry
// with missing or mistyped fields is dropped. A cached cuBLASLt algorithm that cuBLASLt no longer
// accepts is measured again (the runner checks).
class AutotuneCache {
public:
  // The process's cache, in the kernel cache's directory (none: memory only).
  static AutotuneCache& instance();
  // A cache kept in `file` ("": memory only); reads the file when it exists.
  explicit AutotuneCache(std::string file);

  std::optional<AutotuneEntry> find(const std::string& key) const;
  void put(const std::string& key, const AutotuneEntry& entry);
  const std::string& file() const { return file_; }

  // The file's text for `entries`, and the entries of a file's text: nullopt (with the reason in
  // `why`) where the text is not a cache of this version; malformed entries are left out.
  static std::string serialise(const std::map<std::string, AutotuneEntry>& entries);
  static std::optional<std::map<std::string, AutotuneEntry>> parse(const std::string& text, std::string& why);

private:
  // The entries in the file now; nullopt with a note when it exists but is not a cache.
  std::optional<std::map<std::string, AutotuneEntry>> readFile(bool note) const;
  mutable std::mutex mutex_;
  std::string file_;
  std::map<std::string, AutotuneEntry> map_;
};

}  // namespace pa
