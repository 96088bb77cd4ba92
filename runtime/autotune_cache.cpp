// The GEMM autotune cache's JSON file (nlohmann-json) and its in-memory map.
#include "runtime/autotune_cache.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "codegen/kernel_cache.h"

namespace pa {

namespace {

constexpr const char* kFormat = "pureattention-gemm-autotune";
constexpr int kVersion = 2;
constexpr const char* kFileName = "gemm-autotune-v2.json";

nlohmann::json toJson(const AutotuneEntry& e) {
  switch (e.kind) {
  case AutotuneEntry::Kind::Generated: return {{"provider", "generated"}};
  case AutotuneEntry::Kind::Cublaslt: return {{"provider", "cublaslt"}, {"algo", e.algo}, {"transposed_b", e.transposedB}};
  case AutotuneEntry::Kind::Tiles: return {{"tiles", e.tiles}};
  }
  return {};
}

std::optional<AutotuneEntry> fromJson(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  AutotuneEntry e;
  if (j.contains("tiles")) {
    const nlohmann::json& t = j["tiles"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > 1000) return std::nullopt;
    e.kind = AutotuneEntry::Kind::Tiles;
    e.tiles = t.get<int>();
    return e;
  }
  const auto provider = j.find("provider");
  if (provider == j.end() || !provider->is_string()) return std::nullopt;
  if (*provider == "generated") return e;
  if (*provider != "cublaslt") return std::nullopt;
  const auto algo = j.find("algo");
  const auto transposed = j.find("transposed_b");
  if (algo == j.end() || !algo->is_string() || transposed == j.end() || !transposed->is_boolean()) return std::nullopt;
  e.kind = AutotuneEntry::Kind::Cublaslt;
  e.algo = algo->get<std::string>();
  e.transposedB = transposed->get<bool>();
  return e;
}

}  // namespace

std::string AutotuneCache::serialise(const std::map<std::string, AutotuneEntry>& entries) {
  nlohmann::json all = nlohmann::json::object();
  for (const auto& [key, e] : entries) all[key] = toJson(e);
  const nlohmann::json doc = {{"format", kFormat}, {"version", kVersion}, {"entries", all}};
  return doc.dump(1) + "\n";
}

std::optional<std::map<std::string, AutotuneEntry>> AutotuneCache::parse(const std::string& text, std::string& why) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    why = "not valid JSON";
    return std::nullopt;
  }
  const bool object = doc.is_object();
  const auto format = object ? doc.find("format") : doc.end();
  if (!object || format == doc.end() || !format->is_string() || *format != kFormat) {
    why = "not a GEMM autotune cache";
    return std::nullopt;
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || version->get<int64_t>() != kVersion) {
    why = "another version of the cache";
    return std::nullopt;
  }
  const auto entries = doc.find("entries");
  if (entries == doc.end() || !entries->is_object()) {
    why = "no entries";
    return std::nullopt;
  }
  std::map<std::string, AutotuneEntry> out;
  for (auto it = entries->begin(); it != entries->end(); ++it)
    if (std::optional<AutotuneEntry> e = fromJson(it.value())) out[it.key()] = *e;
  return out;
}

AutotuneCache& AutotuneCache::instance() {
  static AutotuneCache c([] {
    const std::string dir = codegen::KernelCache::instance().directory();
    return dir.empty() ? std::string() : dir + "/" + kFileName;
  }());
  return c;
}

AutotuneCache::AutotuneCache(std::string file) : file_(std::move(file)) {
  if (std::optional<std::map<std::string, AutotuneEntry>> read = readFile(/*note=*/true)) map_ = std::move(*read);
}

std::optional<std::map<std::string, AutotuneEntry>> AutotuneCache::readFile(bool note) const {
  std::error_code ec;
  if (file_.empty() || !std::filesystem::exists(file_, ec)) return std::map<std::string, AutotuneEntry>{};
  std::ifstream in(file_, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  std::string why = "cannot be read";
  std::optional<std::map<std::string, AutotuneEntry>> read;
  if (in) read = parse(text.str(), why);
  if (!read && note) std::cerr << "note: GEMM autotune cache " << file_ << ": " << why << "; ignored (it is rewritten)\n";
  return read;
}

std::optional<AutotuneEntry> AutotuneCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

void AutotuneCache::put(const std::string& key, const AutotuneEntry& entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  map_[key] = entry;
  if (file_.empty()) return;
  // Another process may have added entries since: keep theirs beside ours.
  if (std::optional<std::map<std::string, AutotuneEntry>> onDisk = readFile(/*note=*/false))
    for (auto& [k, e] : *onDisk) map_.emplace(k, e);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file_).parent_path(), ec);
  static std::atomic<unsigned> counter{0};
  const std::string tmp = file_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << serialise(map_);
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;  // a cache that cannot be written only costs a measurement next time
    }
  }
  std::filesystem::rename(tmp, file_, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace pa
