// NVRTC results cached in memory and on disk, so a kernel is compiled once per machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "codegen/nvrtc_compiler.h"

namespace pa::codegen {

// 32 hex digits of the cache's hash of `text` (two independent 64-bit FNV-1a streams), for keys
// of other caches beside it (the GEMM autotuner's).
std::string contentHash(const std::string& text);

struct KernelCacheStats {
  int64_t memoryHits = 0, diskHits = 0, misses = 0, corruptRebuilt = 0;
  double compileSeconds = 0;  // spent in NVRTC on misses (not waiting for a turn), summed over the threads
};

// Note on the key and the file format. The key hashes (two independent 64-bit FNV-1a streams)
// the source, every header's name and text, the architecture, the options and NVRTC's version:
// anything that can change the binary. An entry is <dir>/<key>.cubin holding a magic line, the
// key, the payload's size and its hash, then the cubin; a file that fails any of these checks is
// reported, recompiled and rewritten. Files are written to a temporary name and renamed, so a
// crash never leaves a half-written entry under a valid name.

// How many NVRTC compilations run at a time in the process, whoever asks (the runner's programs
// and the FlashAttention kernels compile side by side): one per core. More threads would only
// share the cores.
int nvrtcAtOnce();

// Calls compile(i) once for every i in [0, count), on up to nvrtcAtOnce() threads: this one and
// helper threads as the system gives them. When all have returned, rethrows the exception of
// the first i that threw.
void compileEach(size_t count, const std::function<void(size_t)>& compile);

class KernelCache {
public:
  // Directory: PA_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/pureattention/kernels, else
  // ~/.cache/pureattention/kernels. PA_KERNEL_CACHE=0 turns the disk cache off (common/debug.h).
  static KernelCache& instance();
  // A cache over `dir` (empty: memory only); tests use their own.
  explicit KernelCache(std::string dir);

  // Compiles through NVRTC unless the same request was compiled before (cubin targets only;
  // PTX requests are not cached). Throws what Nvrtc::compile throws.
  CompileResult compile(const CompileRequest& request);
  std::string keyOf(const CompileRequest& request) const;
  const std::string& directory() const { return dir_; }
  KernelCacheStats stats() const;

private:
  bool readEntry(const std::string& key, std::vector<char>& cubin);
  void writeEntry(const std::string& key, const std::vector<char>& cubin);
  std::string dir_;
  mutable std::mutex mutex_;
  std::map<std::string, std::vector<char>> memory_;
  KernelCacheStats stats_;
};

}  // namespace pa::codegen
