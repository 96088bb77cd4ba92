// The CUDA graph runner.
#include "runtime/cuda_graph_runner.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "codegen/embedded_kernels.h"
#include "codegen/emit.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "passes/memory_plan.h"
#include "runtime/cuda/cublaslt.h"

namespace pa {

struct CudaGraphRunner::Launch {
  cuda::CUfunction fn = nullptr;
  codegen::Kernel kernel;
  int program = 0;
  cuda::KernelParams params;  // resolved once: the buffers never move
  void enqueue(cuda::CUstream stream) const {
    PA_CU_CHECK(cuLaunchKernel(fn, kernel.grid[0], kernel.grid[1], kernel.grid[2], kernel.block[0], kernel.block[1],
                               kernel.block[2], kernel.sharedBytes, stream, params.data(), nullptr));
  }
};

struct CudaGraphRunner::LibraryNode {
  std::unique_ptr<cuda::LtPlan> plan;
  // The same product with B copied untransposed into the node's scratch first (transposed B only).
  std::unique_ptr<cuda::LtPlan> planT;
  std::vector<Launch> transpose;  // codegen::libraryGemmTransposeB
  cuda::LtAlgo algo;
  bool use = false;         // chosen over the generated kernels
  bool transposed = false;  // runs transpose + planT instead of plan
  int output = 0;           // the node output cuBLASLt writes
  int launches = 1;         // kernels a run queues (counted from a capture of it)
  std::vector<Launch> post;  // what cuBLASLt leaves of the epilogue (codegen::libraryGemmEpilogue)
};

namespace {

constexpr int64_t kParamAlignFloats = 64;  // 256 bytes: every parameter starts vector-aligned
constexpr unsigned kDefaultSharedBytes = 48 * 1024;  // dynamic shared memory a launch gets without opting in
constexpr int64_t kArenaAlignFloats = 64;  // 256 bytes, what cuBLASLt's fastest kernels assume
constexpr size_t kLtWorkspaceBytes = 32u << 20;  // cuBLASLt's recommendation for Hopper
constexpr int kLtCandidates = 8;               // algorithms from its heuristic that are measured

// The largest power of two (at most 256) dividing every byte address of a matrix series.
uint32_t alignmentOf(cuda::CUdeviceptr base, int64_t strideElements, size_t elementBytes) {
  uint32_t a = 256;
  while (a > elementBytes &&
         (base % a != 0 || (strideElements > 0 && (static_cast<uint64_t>(strideElements) * elementBytes) % a != 0)))
    a /= 2;
  return a;
}

// Fresh uniform values in [-1, 1) for the autotuner's measurements (never zeros: METHOD.md).
const char* kFillSource = R"(
extern "C" __global__ void pa_fill_uniform(float* p, unsigned long long n, unsigned seed) {
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * 256ull) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    p[i] = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}
)";

// Note on the autotune cache. A choice is keyed by everything that can change it: the device
// and its SM count, cuBLASLt's version, the provider mode, the problem as cuBLASLt sees it and a
// hash of the generated kernels' source. Values: "generated" or "cublaslt <algorithm>". They
// live in memory for the process and, beside the kernel cache (same switches), in
// gemm-autotune-v1.txt, one tab-separated line each; a cached algorithm that cuBLASLt no longer
// accepts is measured again.
class AutotuneCache {
public:
  static AutotuneCache& instance() {
    static AutotuneCache c;
    return c;
  }
  bool find(const std::string& key, std::string& value) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    value = it->second;
    return true;
  }
  void put(const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key] = value;
    if (file_.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(file_).parent_path(), ec);
    std::ofstream(file_, std::ios::app) << key << '\t' << value << '\n';
  }

private:
  AutotuneCache() {
    const std::string dir = codegen::KernelCache::instance().directory();
    if (dir.empty()) return;
    file_ = dir + "/gemm-autotune-v1.txt";
    std::ifstream in(file_);
    std::string line;
    while (std::getline(in, line)) {
      const size_t tab = line.find('\t');
      if (tab != std::string::npos) map_[line.substr(0, tab)] = line.substr(tab + 1);
    }
  }
  std::mutex mutex_;
  std::string file_;
  std::map<std::string, std::string> map_;
};

int64_t alignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

}  // namespace

CudaGraphRunner::CudaGraphRunner(const Graph& g, const cuda::Device& device, const CudaRunnerOptions& opt)
    : g_(g), device_(device), order_(g.topoOrder()), deterministic_(opt.deterministic), tf32_(opt.tf32) {
  device_.makeCurrent();
  const MemoryPlan plan = planMemory(g, kArenaAlignFloats, /*aliasReshapes=*/true, /*storageSizes=*/true);
  // Refuse a step that cannot fit the device before allocating anything (a user mistake: exit 2).
  MemoryLayout layout;
  layout.storageSizes = true;
  layout.aliasReshapes = true;
  layout.alignElements = kArenaAlignFloats;
  layout.paramBytes = 4;                              // fp32 master weights
  layout.paramCopies = opt.shareParamsWith ? 0 : 3;   // weights and Adam's m and v (CudaSession's)
  const cuda::DeviceInfo& info = device_.info();
  checkFitsMemory(g, static_cast<int64_t>(info.totalMemory), "GPU " + std::to_string(info.ordinal) + " (" + info.name + ")",
                  layout, &plan);
  offset_ = plan.offset;
  arenaBytes_ = static_cast<size_t>(plan.arenaElements) * sizeof(float);
  arena_ = cuda::DeviceBuffer(std::max<size_t>(arenaBytes_, 16));
  for (ValueId p : g.params()) {
    if (opt.shareParamsWith) {
      const Graph& other = opt.shareParamsWith->g_;
      const ValueId q = other.findValue(g.value(p).name);
      if (q != kNoValue && other.shape(q) == g.shape(p) && opt.shareParamsWith->paramOffset(q) >= 0) {
        sharedParam_[p] = opt.shareParamsWith->devicePtr(q);
        continue;
      }
    }
    paramOffset_[p] = paramFloats_;
    paramFloats_ += alignUp(numel(g.shape(p)), kParamAlignFloats);
  }
  params_ = cuda::DeviceBuffer(static_cast<size_t>(std::max<int64_t>(paramFloats_, 16)) * sizeof(float));
  params_.fill32(0);

  launches_.resize(g.numNodes());
  const codegen::EmitOptions emit = emitOptionsFor(device_, opt.tf32);
  for (NodeId id : order_) {
    codegen::NodeKernels nk = codegen::emitNode(g, id, emit);
    const Node& n = g.node(id);
    if (nk.external) {
      if (!flash_) flash_ = std::make_unique<FlashAttention>(device_);
      const FlashAttentionConfig cfg = flashConfig(n);
      flash_->validate(cfg, n.op == OpKind::FlashAttentionGrad);
      if (n.op == OpKind::FlashAttentionGrad) scratch_.emplace(id, cuda::DeviceBuffer(std::max<size_t>(flash_->backwardWorkspaceBytes(cfg), 16)));
      continue;
    }
    // A reshape whose output shares its input's bytes has nothing to do.
    if (n.op == OpKind::Reshape && offset_[static_cast<size_t>(n.inputs[0])] >= 0 &&
        offset_[static_cast<size_t>(n.inputs[0])] == offset_[static_cast<size_t>(n.outputs[0])])
      continue;
    size_t scratchBytes = nk.scratchBytes;
    if (opt.tuneGemmTiles && opt.gemm != GemmProvider::Cublaslt && codegen::libraryGemmOf(g, id).supported) {
      // The other tile variants of a generated GEMM (see chooseGemmTiles); one that emits what
      // the emitter's own pick does is not a candidate.
      auto text = [](const codegen::NodeKernels& k) {
        std::string t;
        for (const codegen::Kernel& kk : k.kernels) t += kk.source;
        return t;
      };
      const std::string chosen = text(nk);
      int index = 0;
      for (codegen::GemmTile tile : {codegen::GemmTile::Large, codegen::GemmTile::Medium, codegen::GemmTile::Small}) {
        codegen::EmitOptions alt = emit;
        alt.gemmTile = tile;
        if (text(codegen::emitNode(g, id, alt)) == chosen) continue;
        alt.kernelSuffix = "_v" + std::to_string(++index);
        codegen::NodeKernels ak = codegen::emitNode(g, id, alt);
        scratchBytes = std::max(scratchBytes, ak.scratchBytes);
        std::vector<Launch> variant;
        for (codegen::Kernel& k : ak.kernels) {
          Launch l;
          l.kernel = std::move(k);
          variant.push_back(std::move(l));
          ++kernelCount_;
        }
        tileVariants_[id].push_back(std::move(variant));
      }
    }
    if (scratchBytes > 0) scratch_.emplace(id, cuda::DeviceBuffer(scratchBytes));
    for (codegen::Kernel& k : nk.kernels) {
      Launch l;
      l.kernel = std::move(k);
      launches_[static_cast<size_t>(id)].push_back(std::move(l));
      ++kernelCount_;
    }
  }
  planLibraryGemms(opt);
  compile();

  // Arguments are resolved once (the buffers never move); KernelParams keeps their addresses.
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    for (Launch* lp : nodeLaunches(id)) {
      Launch& l = *lp;
      auto sc = scratch_.find(id);  // every node whose kernels take a scratch has one
      l.params = codegen::launchParams(
          l.kernel, [&](int i) { return ptr(n.inputs[static_cast<size_t>(i)]); },
          [&](int i) { return ptr(n.outputs[static_cast<size_t>(i)]); }, sc != scratch_.end() ? sc->second.ptr() : 0);
    }
  }

  chooseGemmTiles();
  chooseGemmProviders(opt);
  baseLaunches_ = 0;  // plus the launcher's, counted by run()
  for (NodeId id : order_) {
    auto it = library_.find(id);
    baseLaunches_ += it != library_.end() && it->second.use ? it->second.launches
                                                               : static_cast<int>(launches_[static_cast<size_t>(id)].size());
  }
  launchesPerRun_ = baseLaunches_;

  // Constants are uploaded once; their arena ranges are pinned for the whole run.
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::Constant) continue;
    const int64_t count = numel(g.shape(n.outputs[0]));
    std::vector<float> host(static_cast<size_t>(count), static_cast<float>(n.attrs.getFloat("value", 0.0)));
    if (n.attrs.has("data")) {
      const std::vector<double> d = n.attrs.getDoubles("data");
      std::copy(d.begin(), d.end(), host.begin());
    }
    upload(n.outputs[0], host.data());
  }
}

// Note on parallel compilation. One NVRTC program per kernel would pay NVRTC's fixed start-up
// cost (parsing, the embedded headers) once per kernel; one program for the whole graph uses a
// single core. The kernels are dealt, in topological order, into as many programs as there are
// cores (at most 8, and no program smaller than 4 kernels), compiled by one thread each. The
// split depends only on the kernel count and the core count, so the cache keys are stable on
// a machine.
void CudaGraphRunner::compile() {
  if (kernelCount_ == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  programs_ = std::max(1, std::min({cores, 8, (kernelCount_ + 3) / 4}));
  std::vector<std::string> sources(static_cast<size_t>(programs_));
  const int perProgram = (kernelCount_ + programs_ - 1) / programs_;
  std::vector<Launch*> all;
  for (NodeId id : order_)
    for (Launch* l : nodeLaunches(id)) all.push_back(l);
  int index = 0;
  for (Launch* l : all) {
    l->program = index++ / perProgram;
    sources[static_cast<size_t>(l->program)] += l->kernel.source + "\n";
  }
  std::vector<codegen::CompileResult> results(sources.size());
  std::vector<std::exception_ptr> errors(sources.size());
  const std::vector<std::pair<std::string, std::string>> headers = codegen::embeddedKernelHeaders();
  auto work = [&](size_t i) {
    try {
      codegen::CompileRequest req;
      req.kernelName = "graph part " + std::to_string(i + 1) + "/" + std::to_string(sources.size());
      req.source = sources[i];
      req.headers = headers;
      req.arch = device_.info().arch();
      req.extraOptions = {"-lineinfo"};
      results[i] = codegen::KernelCache::instance().compile(req);
    } catch (const codegen::NvrtcError& e) {
      // Name the program's kernels and keep its source where the user can open it.
      std::string names;
      for (const Launch* l : all)
        if (static_cast<size_t>(l->program) == i) names += (names.empty() ? "" : ", ") + l->kernel.name;
      const std::filesystem::path path =
          std::filesystem::temp_directory_path() / ("pureattention-failed-part" + std::to_string(i + 1) + ".cu");
      std::ofstream(path) << sources[i];
      errors[i] = std::make_exception_ptr(codegen::NvrtcError(
          names, "does not compile (source: " + path.string() + "; --dump-kernels DIR writes each kernel alone)", e.log()));
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < sources.size(); ++i) threads.emplace_back(work, i);
  work(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  modules_.resize(results.size(), nullptr);
  for (size_t i = 0; i < results.size(); ++i) PA_CU_CHECK(cuModuleLoadData(&modules_[i], results[i].cubin.data()));
  for (Launch* l : all) {
    PA_CU_CHECK(cuModuleGetFunction(&l->fn, modules_[static_cast<size_t>(l->program)], l->kernel.name.c_str()));
    if (l->kernel.sharedBytes > kDefaultSharedBytes)
      PA_CU_CHECK(cuFuncSetAttribute(l->fn, cuda::kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(l->kernel.sharedBytes)));
  }
  compileSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<CudaGraphRunner::Launch*> CudaGraphRunner::nodeLaunches(NodeId id) {
  std::vector<Launch*> out;
  for (Launch& l : launches_[static_cast<size_t>(id)]) out.push_back(&l);
  if (auto it = tileVariants_.find(id); it != tileVariants_.end())
    for (std::vector<Launch>& variant : it->second)
      for (Launch& l : variant) out.push_back(&l);
  if (auto it = library_.find(id); it != library_.end()) {
    for (Launch& l : it->second.transpose) out.push_back(&l);
    for (Launch& l : it->second.post) out.push_back(&l);
  }
  return out;
}

CudaGraphRunner::~CudaGraphRunner() {
  for (cuda::CUmodule m : modules_)
    if (m) cuda::Driver::instance().api().cuModuleUnload(m);
}

int64_t CudaGraphRunner::paramOffset(ValueId p) const {
  auto it = paramOffset_.find(p);
  return it == paramOffset_.end() ? -1 : it->second;
}

cuda::CUdeviceptr CudaGraphRunner::ptr(ValueId v) const {
  auto it = paramOffset_.find(v);
  if (it != paramOffset_.end()) return params_.ptr() + static_cast<cuda::CUdeviceptr>(it->second) * sizeof(float);
  auto sh = sharedParam_.find(v);
  if (sh != sharedParam_.end()) return sh->second;
  return arena_.ptr() + static_cast<cuda::CUdeviceptr>(offset_[static_cast<size_t>(v)]) * sizeof(float);
}

void CudaGraphRunner::upload(ValueId v, const float* host) {
  const size_t count = static_cast<size_t>(numel(g_.shape(v)));
  if (g_.value(v).type.dtype == DType::BF16) {  // rounded to nearest, as the kernels store
    std::vector<uint16_t> bits(count);
    for (size_t i = 0; i < count; ++i) bits[i] = bf16Bits(host[i]);
    PA_CU_CHECK(cuMemcpyHtoD(ptr(v), bits.data(), count * sizeof(uint16_t)));
    return;
  }
  PA_CU_CHECK(cuMemcpyHtoD(ptr(v), host, count * sizeof(float)));
}

void CudaGraphRunner::download(ValueId v, float* host) const {
  PA_CU_CHECK(cuCtxSynchronize());
  const size_t count = static_cast<size_t>(numel(g_.shape(v)));
  if (g_.value(v).type.dtype == DType::BF16) {
    std::vector<uint16_t> bits(count);
    PA_CU_CHECK(cuMemcpyDtoH(bits.data(), ptr(v), count * sizeof(uint16_t)));
    for (size_t i = 0; i < count; ++i) host[i] = bf16Value(bits[i]);
    return;
  }
  PA_CU_CHECK(cuMemcpyDtoH(host, ptr(v), count * sizeof(float)));
}

void CudaGraphRunner::run(cuda::CUstream stream) {
  const int64_t flashBefore = flash_ ? flash_->launches() : 0;
  for (NodeId id : order_) runNode(id, stream);
  launchesPerRun_ = baseLaunches_ + static_cast<int>((flash_ ? flash_->launches() : 0) - flashBefore);
}

std::vector<CudaGraphRunner::NodeTime> CudaGraphRunner::profile(cuda::CUstream stream, int reps) {
  std::vector<NodeId> timed;
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    if (!launches_[static_cast<size_t>(id)].empty() || library_.count(id) || n.op == OpKind::FlashAttention ||
        n.op == OpKind::FlashAttentionGrad)
      timed.push_back(id);
  }
  std::vector<std::unique_ptr<cuda::Event>> events;
  for (size_t i = 0; i <= timed.size(); ++i) events.push_back(std::make_unique<cuda::Event>(true));
  std::vector<std::vector<float>> ms(timed.size());
  for (int r = 0; r < reps; ++r) {
    for (NodeId id : order_)
      if (std::find(timed.begin(), timed.end(), id) == timed.end()) runNode(id, stream);
    events[0]->record(stream);
    for (size_t i = 0; i < timed.size(); ++i) {
      runNode(timed[i], stream);
      events[i + 1]->record(stream);
    }
    events.back()->synchronize();
    for (size_t i = 0; i < timed.size(); ++i) {
      float t = 0;
      PA_CU_CHECK(cuEventElapsedTime(&t, events[i]->get(), events[i + 1]->get()));
      ms[i].push_back(t);
    }
  }
  std::vector<NodeTime> out;
  for (size_t i = 0; i < timed.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    const Node& n = g_.node(timed[i]);
    std::string shape;
    for (int64_t d : g_.shape(n.outputs[0])) shape += (shape.empty() ? "[" : ",") + std::to_string(d);
    const auto& ls = launches_[static_cast<size_t>(timed[i])];
    std::string name = ls.empty() ? std::string("flash") : ls.front().kernel.name;
    if (gemmProviderOf(timed[i]) == "cublaslt") name = "k" + std::to_string(timed[i]) + "_cublaslt";
    out.push_back({timed[i], name + "  " + opName(n.op) + " " + shape + "]", ms[i][ms[i].size() / 2]});
  }
  std::sort(out.begin(), out.end(), [](const NodeTime& a, const NodeTime& b) { return a.ms > b.ms; });
  return out;
}

FlashAttentionConfig CudaGraphRunner::flashConfig(const Node& n) const {
  FlashAttentionConfig cfg = codegen::flashConfigOf(g_, n, tf32_);
  cfg.deterministic = deterministic_;
  return cfg;
}

void CudaGraphRunner::runNode(NodeId id, cuda::CUstream stream) {
  const Node& n = g_.node(id);
  if (n.op == OpKind::FlashAttention || n.op == OpKind::FlashAttentionGrad) {
    const FlashAttentionConfig cfg = flashConfig(n);
    // [B, H, S, D] contiguous, or [B, S, H, D] (layout "bshd": the projections' own layout).
    const bool bshd = codegen::flashLayoutBshd(n);
    auto tensor = [&](ValueId v, int heads, int seq) {
      FlashTensor t = FlashTensor::contiguous(ptr(v), heads, seq, cfg.headDim);
      if (bshd) {
        t.headStride = cfg.headDim;
        t.seqStride = static_cast<long long>(heads) * cfg.headDim;
      }
      return t;
    };
    auto qt = [&](ValueId v) { return tensor(v, cfg.heads, cfg.qLen); };
    auto kt = [&](ValueId v) { return tensor(v, cfg.kvHeads, cfg.kLen); };
    if (n.op == OpKind::FlashAttention) {
      FlashForwardArgs a;
      a.q = qt(n.inputs[0]);
      a.k = kt(n.inputs[1]);
      a.v = kt(n.inputs[2]);
      a.o = qt(n.outputs[0]);
      a.lse = ptr(n.outputs[1]);
      if (cfg.sinkLogits) a.sinkLogits = ptr(n.inputs[3]);
      flash_->forward(cfg, a, stream);
    } else {
      FlashBackwardArgs a;
      a.q = qt(n.inputs[0]);
      a.k = kt(n.inputs[1]);
      a.v = kt(n.inputs[2]);
      a.o = qt(n.inputs[3]);
      a.lse = ptr(n.inputs[4]);
      a.dO = qt(n.inputs[5]);
      a.dQ = qt(n.outputs[0]);
      a.dK = kt(n.outputs[1]);
      a.dV = kt(n.outputs[2]);
      if (cfg.sinkLogits) {
        a.sinkLogits = ptr(n.inputs[6]);
        a.dSinkLogits = ptr(n.outputs[3]);
      }
      a.workspace = scratch_.at(id).ptr();
      flash_->backward(cfg, a, stream);
    }
    return;
  }
  if (auto it = library_.find(id); it != library_.end() && it->second.use) {
    runLibrary(id, it->second, stream);
    return;
  }
  for (const Launch& l : launches_[static_cast<size_t>(id)]) l.enqueue(stream);
}

std::string CudaGraphRunner::gemmProviderOf(NodeId id) const {
  auto it = library_.find(id);
  if (it != library_.end() && it->second.use) return "cublaslt";
  return codegen::libraryGemmOf(g_, id).supported ? "generated" : "";
}

void CudaGraphRunner::runLibrary(NodeId id, const LibraryNode& l, cuda::CUstream stream) {
  const Node& n = g_.node(id);
  const cuda::LtPlan& plan = l.transposed ? *l.planT : *l.plan;
  const cuda::CUdeviceptr bias = plan.problem().bias ? ptr(n.inputs[2]) : 0;
  if (l.transposed)
    for (const Launch& k : l.transpose) k.enqueue(stream);
  plan.run(l.algo, ptr(n.inputs[0]), l.transposed ? scratch_.at(id).ptr() : ptr(n.inputs[1]), bias,
           ptr(n.outputs[static_cast<size_t>(l.output)]), ltWorkspace_.ptr(), stream);
  for (const Launch& k : l.post) k.enqueue(stream);
}

// cuBLASLt descriptors for every GEMM node it can run, with the epilogue it applies: bias and
// ReLU where it offers them for this problem, else less, and the rest as a generated kernel.
void CudaGraphRunner::planLibraryGemms(const CudaRunnerOptions& opt) {
  if (opt.gemm == GemmProvider::Generated) return;
  cuda::CublasLt& lt = cuda::CublasLt::instance();
  if (!lt.available()) {
    if (opt.gemm == GemmProvider::Cublaslt)
      throw std::runtime_error("compiler.gemm: cublaslt, but cuBLASLt is unavailable: " + lt.unavailableReason());
    return;  // auto: the generated kernels, as the summary line says
  }
  for (NodeId id : order_) {
    const codegen::LibraryGemm lg = codegen::libraryGemmOf(g_, id);
    if (!lg.supported) continue;
    const Node& n = g_.node(id);
    cuda::LtProblem p;
    p.batch = lg.geometry.batch, p.m = lg.geometry.m, p.n = lg.geometry.n, p.k = lg.geometry.k;
    p.strideA = lg.geometry.strideA, p.strideB = lg.geometry.strideB;
    p.transA = lg.geometry.transA, p.transB = lg.geometry.transB;
    const ValueId c = n.outputs[static_cast<size_t>(lg.output)];
    p.bf16 = g_.value(n.inputs[0]).type.dtype == DType::BF16;
    if (p.bf16 != (g_.value(n.inputs[1]).type.dtype == DType::BF16)) continue;  // mixed operands: generated
    p.fp32C = p.bf16 && g_.value(c).type.dtype == DType::F32;
    p.tf32 = opt.tf32 && !p.bf16;
    const size_t ab = p.bf16 ? 2 : 4, cb = p.bf16 && !p.fp32C ? 2 : 4;
    p.alignA = alignmentOf(ptr(n.inputs[0]), p.strideA, ab);
    p.alignB = alignmentOf(ptr(n.inputs[1]), p.strideB, ab);
    p.alignC = alignmentOf(ptr(c), p.batch > 1 ? p.m * p.n : 0, cb);
    std::vector<std::pair<bool, bool>> levels{{lg.bias, lg.relu}};  // (bias, ReLU), fewest kernels first
    if (lg.relu) levels.push_back({lg.bias, false});
    if (lg.bias) levels.push_back({false, false});
    std::unique_ptr<cuda::LtPlan> plan;
    for (const auto& [bias, relu] : levels) {
      p.bias = bias;
      p.relu = relu;
      plan = lt.plan(p, kLtWorkspaceBytes, kLtCandidates);
      if (!plan->candidates().empty()) break;
    }
    if (plan->candidates().empty()) continue;  // cuBLASLt cannot run it: the generated kernels do
    LibraryNode l;
    l.output = lg.output;
    codegen::NodeKernels post = codegen::libraryGemmEpilogue(g_, id, plan->problem().bias, plan->problem().relu);
    for (codegen::Kernel& k : post.kernels) {
      Launch launch;
      launch.kernel = std::move(k);
      l.post.push_back(std::move(launch));
      ++kernelCount_;
    }
    // A transposed B small beside the output may be worth copying untransposed every run.
    if (p.transB && p.batch == 1 && p.k * 4 <= p.m && !p.bf16) {  // (the copy kernel is fp32)
      cuda::LtProblem pt = plan->problem();
      pt.transB = false;
      pt.alignB = 256;  // the scratch buffer
      std::unique_ptr<cuda::LtPlan> planT = lt.plan(pt, kLtWorkspaceBytes, kLtCandidates);
      if (!planT->candidates().empty()) {
        codegen::NodeKernels tk = codegen::libraryGemmTransposeB(g_, id);
        auto sc = scratch_.find(id);
        if (sc == scratch_.end() || sc->second.bytes() < tk.scratchBytes) scratch_[id] = cuda::DeviceBuffer(tk.scratchBytes);
        for (codegen::Kernel& k : tk.kernels) {
          Launch launch;
          launch.kernel = std::move(k);
          l.transpose.push_back(std::move(launch));
          ++kernelCount_;
        }
        l.planT = std::move(planT);
      }
    }
    l.plan = std::move(plan);
    library_.emplace(id, std::move(l));
  }
  if (!library_.empty()) ltWorkspace_ = cuda::DeviceBuffer(kLtWorkspaceBytes);
}

// Note on the provider choice. With compiler.gemm: auto, each GEMM node runs on whichever of
// the generated kernels and cuBLASLt's heuristic candidates is fastest for its own shape; with
// cublaslt, the fastest candidate. Each candidate is measured as the whole node (product and
// epilogue kernels) on the node's own buffers filled with fresh random values (the arena holds
// nothing yet: parameters and constants are uploaded afterwards), replayed from a CUDA graph so
// that the launch cost of the host does not count, as in the captured training step: a warm-up
// run, then the median of 5 replays of enough runs to last ~0.5 ms.
void CudaGraphRunner::chooseGemmProviders(const CudaRunnerOptions& opt) {
  if (library_.empty()) {
    for (NodeId id : order_) gemmStats_.generated += codegen::libraryGemmOf(g_, id).supported ? 1 : 0;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const cuda::CublasLt& lt = cuda::CublasLt::instance();
  const std::string prefix = device_.info().name + "|" + std::to_string(device_.info().multiprocessors) + "|lt" +
                             std::to_string(lt.version()) + "|" + gemmProviderName(opt.gemm) + "|";
  cuda::Stream stream;
  for (NodeId id : order_) {
    const bool gemmNode = codegen::libraryGemmOf(g_, id).supported;
    auto it = library_.find(id);
    if (it == library_.end()) {
      gemmStats_.generated += gemmNode ? 1 : 0;
      continue;
    }
    LibraryNode& l = it->second;
    std::string generatedSource;
    for (const Launch& k : launches_[static_cast<size_t>(id)]) generatedSource += k.kernel.source;
    const std::string key = prefix + l.plan->problem().describe() + "|post" + std::to_string(l.post.size()) + "|gen" +
                            codegen::contentHash(generatedSource);
    GemmChoice choice;
    choice.node = id;
    {
      const cuda::LtProblem& lp = l.plan->problem();
      choice.label = "k" + std::to_string(id) + " " + opName(g_.node(id).op) + " " + std::to_string(lp.m) + "x" +
                     std::to_string(lp.n) + "x" + std::to_string(lp.k) +
                     (lp.batch > 1 ? " batch " + std::to_string(lp.batch) : std::string()) + " " + (lp.transA ? "T" : "N") +
                     (lp.transB ? "T" : "N");
    }
    std::string cached;
    bool decided = false;
    if (!opt.forceTransposedB && AutotuneCache::instance().find(key, cached)) {
      cuda::LtAlgo algo;
      if (cached == "generated" && opt.gemm == GemmProvider::Auto) {
        l.use = false;
        decided = true;
      } else if (cached.rfind("cublaslt ", 0) == 0 && cuda::LtAlgo::fromHex(cached.substr(9), algo) && l.plan->check(algo)) {
        l.use = true;
        l.algo = algo;
        decided = true;
      } else if (cached.rfind("cublaslt-t ", 0) == 0 && l.planT && cuda::LtAlgo::fromHex(cached.substr(11), algo) &&
                 l.planT->check(algo)) {
        l.use = l.transposed = true;
        l.algo = algo;
        decided = true;
      }
      gemmStats_.cached += decided ? 1 : 0;
      choice.cached = decided;
    }
    if (!decided) {
      fillForTuning(stream);
      double best = 1e30;
      if (opt.gemm == GemmProvider::Auto)
        best = choice.generatedMs = measure(stream, [&](cuda::CUstream st) {
          for (const Launch& k : launches_[static_cast<size_t>(id)]) k.enqueue(st);
        });
      bool library = false, transposed = false;
      cuda::LtAlgo bestAlgo;
      for (bool t : {false, true}) {
        if ((t && !l.planT) || (!t && l.planT && opt.forceTransposedB)) continue;
        l.transposed = t;
        for (const cuda::LtAlgo& algo : (t ? l.planT : l.plan)->candidates()) {
          if (algo.workspaceBytes > kLtWorkspaceBytes) continue;
          l.algo = algo;
          double ms = 1e30;
          try {
            ms = measure(stream, [&](cuda::CUstream st) { runLibrary(id, l, st); });
          } catch (const cuda::CudaError&) {
            continue;  // a candidate that fails to launch is not a candidate
          }
          if (ms < best) best = ms, library = true, transposed = t, bestAlgo = algo;
          if (choice.libraryMs < 0 || ms < choice.libraryMs) choice.libraryMs = ms;
        }
      }
      l.use = library;
      l.transposed = transposed;
      l.algo = bestAlgo;
      ++gemmStats_.measured;
      if (!opt.forceTransposedB) AutotuneCache::instance().put(key, !l.use ? "generated" : (l.transposed ? "cublaslt-t " : "cublaslt ") + l.algo.hex());
    }
    choice.library = l.use;
    choice.transposedB = l.use && l.transposed;
    gemmChoices_.push_back(choice);
    if (l.use) {  // cuBLASLt may queue more than one kernel (a split-K reduce): count them
      cuda::CapturedGraph one;
      one.capture(stream, [&] { runLibrary(id, l, stream.get()); });
      l.launches = static_cast<int>(one.nodeCount());
    }
    if (l.use)
      ++gemmStats_.library;
    else
      ++gemmStats_.generated;
  }
  stream.synchronize();
  gemmStats_.tuneSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

codegen::EmitOptions CudaGraphRunner::emitOptionsFor(const cuda::Device& device, bool tf32) {
  codegen::EmitOptions emit;
  emit.tf32 = tf32;
  emit.wgmma = device.info().arch() == "sm_90a";
  emit.fullRateFp64 = FlashTarget::of(device.info()).fullRateFp64;
  emit.sms = device.info().multiprocessors;
  return emit;
}

void CudaGraphRunner::fillForTuning(cuda::Stream& stream) {
  if (tuningFilled_) return;
  tuningFilled_ = true;
  CudaModule fillModule(kFillSource, device_);
  const cuda::CUfunction f = fillModule.function("pa_fill_uniform");
  unsigned seed = 0x9e3779b9u;
  for (const cuda::DeviceBuffer* b : {&arena_, &params_}) {
    cuda::CUdeviceptr p = b->ptr();
    unsigned long long count = b->bytes() / sizeof(float);
    void* args[] = {&p, &count, &seed};
    CudaModule::launch(f, static_cast<int64_t>(count), args, stream.get());
    seed += 0x632be5abu;
  }
  stream.synchronize();  // the module is unloaded when this returns
}

double CudaGraphRunner::measure(cuda::Stream& stream, const std::function<void(cuda::CUstream)>& enqueue) {
  cuda::Event a(true), b(true);
  a.record(stream.get());
  enqueue(stream.get());  // warm-up, and the length of one run
  b.record(stream.get());
  b.synchronize();
  float one = 0;
  PA_CU_CHECK(cuEventElapsedTime(&one, a.get(), b.get()));
  const int reps = std::clamp(static_cast<int>(0.5f / std::max(one, 1e-3f)), 1, 50);
  cuda::CapturedGraph graph;
  graph.capture(stream, [&] {
    for (int r = 0; r < reps; ++r) enqueue(stream.get());
  });
  graph.launch(stream);
  std::vector<float> ms;
  for (int s = 0; s < 5; ++s) {
    a.record(stream.get());
    graph.launch(stream);
    b.record(stream.get());
    b.synchronize();
    float t = 0;
    PA_CU_CHECK(cuEventElapsedTime(&t, a.get(), b.get()));
    ms.push_back(t / static_cast<float>(reps));
  }
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(ms[ms.size() / 2]);
}

// Note on tile tuning. The emitter picks a GEMM's tiles (and K splits) from the shape with a cost
// model; the runner also compiles the node's other tile variants (tileVariants_) and, before the
// provider choice, times each candidate as the whole node on its own buffers (fresh random
// values, CUDA-graph replays, median), keeping the fastest in launches_. The choice is cached in
// the autotune cache under the device, its SM count and a hash of every candidate's source, as
// "tiles <index>" (0: the emitter's pick). Variants that lose stay compiled but never run.
void CudaGraphRunner::chooseGemmTiles() {
  if (tileVariants_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string prefix = device_.info().name + "|" + std::to_string(device_.info().multiprocessors) + "|tiles|";
  cuda::Stream stream;
  for (auto& [id, variants] : tileVariants_) {
    std::vector<Launch>& chosen = launches_[static_cast<size_t>(id)];
    std::string sources;
    for (const Launch& l : chosen) sources += l.kernel.source;
    for (const std::vector<Launch>& v : variants)
      for (const Launch& l : v) sources += l.kernel.source;
    const std::string key = prefix + codegen::contentHash(sources);
    std::string cached;
    size_t best = 0;
    if (AutotuneCache::instance().find(key, cached) && cached.rfind("tiles ", 0) == 0 &&
        std::stoul(cached.substr(6)) <= variants.size()) {
      best = std::stoul(cached.substr(6));
      ++gemmStats_.tilesCached;
    } else {
      fillForTuning(stream);
      auto timeOf = [&](const std::vector<Launch>& launches) {
        return measure(stream, [&](cuda::CUstream st) {
          for (const Launch& k : launches) k.enqueue(st);
        });
      };
      double bestMs = timeOf(chosen);
      for (size_t i = 0; i < variants.size(); ++i) {
        const double ms = timeOf(variants[i]);
        if (ms < bestMs) bestMs = ms, best = i + 1;
      }
      AutotuneCache::instance().put(key, "tiles " + std::to_string(best));
      ++gemmStats_.tilesMeasured;
    }
    if (best > 0) {
      std::swap(chosen, variants[best - 1]);  // element addresses (and so Launch::params) survive a swap
      ++gemmStats_.tilesChanged;
    }
  }
  stream.synchronize();
  gemmStats_.tuneSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CudaModule::CudaModule(const std::string& source, const cuda::Device& device) {
  device.makeCurrent();
  codegen::CompileRequest req;
  req.kernelName = "module";
  req.source = source;
  req.arch = device.info().arch();
  const codegen::CompileResult r = codegen::KernelCache::instance().compile(req);
  PA_CU_CHECK(cuModuleLoadData(&module_, r.cubin.data()));
}

CudaModule::~CudaModule() {
  if (module_) cuda::Driver::instance().api().cuModuleUnload(module_);
}

cuda::CUfunction CudaModule::function(const char* name) const {
  cuda::CUfunction f = nullptr;
  PA_CU_CHECK(cuModuleGetFunction(&f, module_, name));
  return f;
}

void CudaModule::launch(cuda::CUfunction fn, int64_t work, void** args, cuda::CUstream stream) {
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + 255) / 256, 65535 * 8)));
  PA_CU_CHECK(cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
}

}  // namespace pa
