// The kernel cache.
#include "codegen/kernel_cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include "common/debug.h"

namespace pa::codegen {

int nvrtcAtOnce() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

void compileEach(size_t count, const std::function<void(size_t)>& compile) {
  std::vector<std::exception_ptr> errors(count);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < count;) {
      try {
        compile(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  const size_t threads = std::min(count, static_cast<size_t>(nvrtcAtOnce()));
  helpers.reserve(threads);
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // this thread compiles what the others leave
    }
  }
  work();
  for (std::thread& t : helpers) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

namespace {

class CompileSlots {
public:
  CompileSlots() : free_(nvrtcAtOnce()) {}
  void acquire() {
    std::unique_lock<std::mutex> lock(mutex_);
    freed_.wait(lock, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++free_;
    }
    freed_.notify_one();
  }

private:
  std::mutex mutex_;
  std::condition_variable freed_;
  int free_;
};

CompileSlots& compileSlots() {
  static CompileSlots slots;
  return slots;
}

// NVRTC once a slot is free; `seconds` (if given) gets NVRTC's time, not the wait.
CompileResult compileInASlot(const CompileRequest& request, double* seconds) {
  struct Slot {
    Slot() { compileSlots().acquire(); }
    ~Slot() { compileSlots().release(); }
  } slot;
  const auto t0 = std::chrono::steady_clock::now();
  CompileResult r = Nvrtc::instance().compile(request);
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

struct Hasher {
  uint64_t a = 1469598103934665603ull, b = 0x9ae16a3b2f90404full;
  void add(const std::string& s) {
    for (unsigned char c : s) {
      a = (a ^ c) * 1099511628211ull;
      b = (b ^ c) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
    }
    a = (a ^ 0xff) * 1099511628211ull;  // a separator, so ("ab", "c") differs from ("a", "bc")
    b = (b ^ 0xff) * 0x100000001b3ull;
  }
  std::string hex() const {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
    return buf;
  }
};

std::string payloadHash(const std::vector<char>& data) {
  Hasher h;
  h.add(std::string(data.begin(), data.end()));
  return h.hex();
}

const char* kMagic = "PUREATTENTION-KERNEL-1";

std::string defaultDir() {
  if (!debugSwitches().kernelDiskCache) return "";
  if (const char* d = std::getenv("PA_KERNEL_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/pureattention/kernels";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/pureattention/kernels";
  return "";
}

}  // namespace

std::string contentHash(const std::string& text) {
  Hasher h;
  h.add(text);
  return h.hex();
}

KernelCache& KernelCache::instance() {
  static KernelCache cache(defaultDir());
  return cache;
}

KernelCache::KernelCache(std::string dir) : dir_(std::move(dir)) {}

std::string KernelCache::keyOf(const CompileRequest& r) const {
  Hasher h;
  h.add(r.source);
  for (const auto& hd : r.headers) {
    h.add(hd.first);
    h.add(hd.second);
  }
  h.add(r.arch);
  for (const std::string& o : r.extraOptions) h.add(o);
  h.add(Nvrtc::instance().version());
  return h.hex();
}

bool KernelCache::readEntry(const std::string& key, std::vector<char>& cubin) {
  const std::filesystem::path path = std::filesystem::path(dir_) / (key + ".cubin");
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string magic, fileKey, hash;
  size_t size = 0;
  bool ok = static_cast<bool>(std::getline(in, magic)) && magic == kMagic && std::getline(in, fileKey) && fileKey == key &&
            (in >> size) && (in >> hash) && in.get() == '\n';
  if (ok) {
    cubin.assign(size, '\0');
    ok = static_cast<bool>(in.read(cubin.data(), static_cast<std::streamsize>(size))) && in.peek() == EOF &&
         payloadHash(cubin) == hash;
  }
  if (!ok) {
    std::fprintf(stderr, "kernel cache: entry %s is corrupt; recompiling it\n", path.c_str());
    ++stats_.corruptRebuilt;
    cubin.clear();
  }
  return ok;
}

void KernelCache::writeEntry(const std::string& key, const std::vector<char>& cubin) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::filesystem::path path = std::filesystem::path(dir_) / (key + ".cubin");
  const std::filesystem::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;  // an unwritable cache only costs the next run a compile
    out << kMagic << "\n" << key << "\n" << cubin.size() << " " << payloadHash(cubin) << "\n";
    out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  }
  std::filesystem::rename(tmp, path, ec);
}

CompileResult KernelCache::compile(const CompileRequest& request) {
  const bool cubinTarget = request.arch.rfind("sm_", 0) == 0;
  if (!cubinTarget) return compileInASlot(request, nullptr);
  const std::string key = keyOf(request);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = memory_.find(key);
    if (it != memory_.end()) {
      ++stats_.memoryHits;
      return CompileResult{it->second, "", ""};
    }
    std::vector<char> cubin;
    if (!dir_.empty() && readEntry(key, cubin)) {
      ++stats_.diskHits;
      memory_[key] = cubin;
      return CompileResult{cubin, "", ""};
    }
  }
  // NVRTC runs outside the lock, so independent programs compile in parallel threads; two
  // threads asking for the same key both compile it and store the same bytes.
  double seconds = 0;
  CompileResult r = compileInASlot(request, &seconds);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.compileSeconds += seconds;
  ++stats_.misses;
  memory_[key] = r.cubin;
  if (!dir_.empty()) writeEntry(key, r.cubin);
  return r;
}

KernelCacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace pa::codegen
