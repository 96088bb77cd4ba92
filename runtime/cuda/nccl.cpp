// NCCL through dlopen (runtime/cuda/nccl.h).
#include "runtime/cuda/nccl.h"

#include <dlfcn.h>

#include <cstdint>
#include <vector>

#include "runtime/cuda/dynamic_library.h"

namespace pa::cuda {

namespace {

// NCCL's documented values: ncclResult_t 0 is ncclSuccess; ncclDataType_t 7 is ncclFloat32;
// ncclRedOp_t 4 is ncclAvg.
using ncclResult = int;
constexpr ncclResult kNcclSuccess = 0;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclAvg = 4;

}  // namespace

struct Nccl::Api {
  ncclResult (*ncclGetVersion)(int*) = nullptr;
  ncclResult (*ncclGetUniqueId)(NcclUniqueId*) = nullptr;
  ncclResult (*ncclCommInitRank)(void**, int, NcclUniqueId, int) = nullptr;
  ncclResult (*ncclCommDestroy)(void*) = nullptr;
  ncclResult (*ncclAllReduce)(const void*, void*, size_t, int, int, void*, CUstream) = nullptr;
  ncclResult (*ncclGroupStart)() = nullptr;
  ncclResult (*ncclGroupEnd)() = nullptr;
  const char* (*ncclGetErrorString)(ncclResult) = nullptr;
};

namespace {

void ncclCheck(const Nccl::Api* api, ncclResult r, const char* call);

}  // namespace

Nccl& Nccl::instance() {
  static Nccl n;
  return n;
}

Nccl::Nccl() : api_(std::make_unique<Api>()) {
  std::string tried;
  handle_ = openFirstLibrary(
      libraryCandidates("PA_NCCL_LIBRARY", {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"},
                        {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                         "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                         "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                         "/usr/local/lib/python3*/dist-packages/nvidia/cu13/lib/libnccl.so.2",
                         "/usr/local/lib/python3*/site-packages/nvidia/cu13/lib/libnccl.so.2"}),
      path_, tried);
  if (!handle_) {
    reason_ = "libnccl.so.2 was not found (tried " + tried + "; PA_NCCL_LIBRARY names it)";
    return;
  }
  std::string missing;
  auto resolve = [&](auto& slot, const char* name) { resolveSymbol(handle_, slot, name, missing); };
  resolve(api_->ncclGetVersion, "ncclGetVersion");
  resolve(api_->ncclGetUniqueId, "ncclGetUniqueId");
  resolve(api_->ncclCommInitRank, "ncclCommInitRank");
  resolve(api_->ncclCommDestroy, "ncclCommDestroy");
  resolve(api_->ncclAllReduce, "ncclAllReduce");
  resolve(api_->ncclGroupStart, "ncclGroupStart");
  resolve(api_->ncclGroupEnd, "ncclGroupEnd");
  resolve(api_->ncclGetErrorString, "ncclGetErrorString");
  if (!missing.empty()) {
    reason_ = path_ + " lacks " + missing;
    return;
  }
  if (api_->ncclGetVersion(&version_) != kNcclSuccess || version_ < 21000) {
    reason_ = path_ + " is NCCL " + version() + "; ncclAvg needs 2.10 or later";
    return;
  }
  available_ = true;
}

Nccl::~Nccl() = default;  // the library stays loaded until the process ends

std::string Nccl::version() const {
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
  return std::to_string(version_ / 10000) + "." + std::to_string(version_ / 100 % 100) + "." + std::to_string(version_ % 100);
}

NcclUniqueId Nccl::uniqueId() const {
  NcclUniqueId id{};
  ncclCheck(api_.get(), api_->ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

namespace {

void ncclCheck(const Nccl::Api* api, ncclResult r, const char* call) {
  if (r != kNcclSuccess)
    throw CudaError(std::string("NCCL: ") + call + " failed: " + api->ncclGetErrorString(r) + " (NCCL_DEBUG=WARN says more)",
                    static_cast<CUresult>(r));
}

}  // namespace

NcclComm::NcclComm(const NcclUniqueId& id, int ranks, int rank) {
  const Nccl& n = Nccl::instance();
  ncclCheck(n.api_.get(), n.api_->ncclCommInitRank(&comm_, ranks, id, rank), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (comm_) Nccl::instance().api_->ncclCommDestroy(comm_);
}

void NcclComm::groupStart() {
  const Nccl& n = Nccl::instance();
  ncclCheck(n.api_.get(), n.api_->ncclGroupStart(), "ncclGroupStart");
}

void NcclComm::groupEnd() {
  const Nccl& n = Nccl::instance();
  ncclCheck(n.api_.get(), n.api_->ncclGroupEnd(), "ncclGroupEnd");
}

void NcclComm::allReduceMean(CUdeviceptr buffer, size_t count, CUstream stream) {
  const Nccl& n = Nccl::instance();
  void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(buffer));
  ncclCheck(n.api_.get(), n.api_->ncclAllReduce(p, p, count, kNcclFloat32, kNcclAvg, comm_, stream), "ncclAllReduce");
}

}  // namespace pa::cuda
