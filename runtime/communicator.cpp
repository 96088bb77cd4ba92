// The MPI communicator: the functions of libpa_mpi.so (runtime/mpi/mpi_plugin.h) behind
// Communicator, loaded with dlopen.
#include "runtime/communicator.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "runtime/mpi/mpi_plugin.h"

namespace pa {

namespace {

struct MpiApi {
  decltype(&pa_mpi_abi) abi = nullptr;
  decltype(&pa_mpi_init) init = nullptr;
  decltype(&pa_mpi_allreduce_sum_f64) sumF64 = nullptr;
  decltype(&pa_mpi_allreduce_sum_f32) sumF32 = nullptr;
  decltype(&pa_mpi_bcast) bcast = nullptr;
  decltype(&pa_mpi_allgather) allgather = nullptr;
  decltype(&pa_mpi_finish) finish = nullptr;
};

class MpiCommunicator final : public Communicator {
public:
  explicit MpiCommunicator(const MpiApi& api) : api_(api) {
    char version[512] = {};
    if (api_.init(&rank_, &size_, &localRank_, version, sizeof version, err_, sizeof err_) != 0)
      throw std::runtime_error(std::string("MPI: ") + err_);
    version_ = version;
    const size_t cut = version_.find_first_of("\n,");
    if (cut != std::string::npos) version_.resize(cut);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int localRank() const override { return localRank_; }
  std::string describe() const override { return "MPI (" + version_ + ")"; }
  void allReduceSum(double* v, size_t n) override { check(api_.sumF64(v, n, err_, sizeof err_)); }
  void allReduceSum(float* v, size_t n) override { check(api_.sumF32(v, n, err_, sizeof err_)); }
  void broadcast(void* data, size_t bytes, int root) override { check(api_.bcast(data, bytes, root, err_, sizeof err_)); }
  std::vector<std::string> allGather(const std::string& mine, double timeoutSeconds) override {
    // Lengths first, then every text padded to the longest.
    const uint64_t len = mine.size();
    std::vector<uint64_t> lens(static_cast<size_t>(size_));
    gather(&len, sizeof len, lens.data(), timeoutSeconds);
    uint64_t longest = 0;
    for (uint64_t l : lens) longest = std::max(longest, l);
    std::string padded = mine;
    padded.resize(static_cast<size_t>(longest), '\0');
    std::string all(static_cast<size_t>(longest) * static_cast<size_t>(size_), '\0');
    if (longest > 0) gather(padded.data(), static_cast<size_t>(longest), all.data(), timeoutSeconds);
    std::vector<std::string> out;
    for (size_t r = 0; r < lens.size(); ++r) out.push_back(all.substr(r * static_cast<size_t>(longest), static_cast<size_t>(lens[r])));
    return out;
  }
  int finish(int code, double timeoutSeconds) override {
    api_.finish(code, timeoutSeconds);
    return code;
  }

private:
  void check(int rc) {
    if (rc != 0) throw std::runtime_error(std::string("MPI: ") + err_);
  }
  void gather(const void* mine, size_t bytes, void* all, double timeoutSeconds) {
    const int rc = api_.allgather(mine, bytes, all, timeoutSeconds, err_, sizeof err_);
    if (rc == 2)
      throw std::runtime_error("the ranks' rendezvous timed out: " + std::string(err_) +
                               " (a rank failed to start or is stuck; PA_RENDEZVOUS_TIMEOUT sets the wait in seconds)");
    check(rc);
  }
  MpiApi api_;
  int rank_ = 0, size_ = 1, localRank_ = 0;
  std::string version_;
  char err_[1024] = {};
};

std::string pluginPath() {
  if (const char* env = std::getenv("PA_MPI_PLUGIN"); env && *env) return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ((ec ? std::filesystem::path(".") : exe.parent_path()) / "libpa_mpi.so").string();
}

}  // namespace

std::unique_ptr<Communicator> loadMpiCommunicator() {
  const std::string path = pluginPath();
  // RTLD_GLOBAL: Open MPI's own components (loaded by MPI_Init) resolve libmpi's symbols globally.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load the MPI plugin " + path + ": " + (why ? why : "unknown error") +
                             " (it needs Open MPI's libmpi; PA_MPI_PLUGIN names the plugin)");
  }
  MpiApi api;
  std::string missing;
  auto resolve = [&](auto& slot, const char* name) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(handle, name));
    if (!slot && missing.empty()) missing = name;
  };
  resolve(api.abi, "pa_mpi_abi");
  resolve(api.init, "pa_mpi_init");
  resolve(api.sumF64, "pa_mpi_allreduce_sum_f64");
  resolve(api.sumF32, "pa_mpi_allreduce_sum_f32");
  resolve(api.bcast, "pa_mpi_bcast");
  resolve(api.allgather, "pa_mpi_allgather");
  resolve(api.finish, "pa_mpi_finish");
  if (!missing.empty()) throw std::runtime_error("the MPI plugin " + path + " lacks " + missing);
  if (api.abi() != PA_MPI_PLUGIN_ABI)
    throw std::runtime_error("the MPI plugin " + path + " is from another build (interface " + std::to_string(api.abi()) +
                             ", this program's " + std::to_string(PA_MPI_PLUGIN_ABI) + ")");
  return std::make_unique<MpiCommunicator>(api);
}

}  // namespace pa
