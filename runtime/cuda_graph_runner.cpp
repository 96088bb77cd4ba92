// The CUDA graph runner.
#include "runtime/cuda_graph_runner.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "codegen/embedded_kernels.h"
#include "codegen/emit.h"
#include "codegen/flops.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "passes/autodiff.h"
#include "passes/memory_plan.h"
#include "runtime/cuda_graph_runner_internal.h"
#include "runtime/kernel_params.h"

namespace pa {


namespace {

constexpr int64_t kParamAlignFloats = 64;  // 256 bytes: every parameter starts vector-aligned
constexpr unsigned kDefaultSharedBytes = 48 * 1024;  // dynamic shared memory a launch gets without opting in
constexpr int64_t kArenaAlignFloats = 64;  // 256 bytes, what cuBLASLt's fastest kernels assume

int64_t alignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

}  // namespace

struct CudaGraphRunner::CompiledKernels {
  struct Entry {
    cuda::CUfunction fn = nullptr;
    unsigned sharedOptIn = 0;  // the dynamic shared memory the function is opted into (0: the default)
  };
  std::unordered_map<std::string, Entry> bySource;  // codegen::sourceWithoutName
  std::vector<cuda::CUmodule> modules;              // which hold the functions
  CompiledKernels() = default;
  CompiledKernels(const CompiledKernels&) = delete;
  CompiledKernels& operator=(const CompiledKernels&) = delete;
  ~CompiledKernels() {
    for (cuda::CUmodule m : modules)
      if (m) cuda::Driver::instance().api().cuModuleUnload(m);
  }
};

CudaGraphRunner::CudaGraphRunner(const Graph& g, const cuda::Device& device, const CudaRunnerOptions& opt)
    : g_(g), device_(device), order_(g.topoOrder()),
      compiled_(opt.shareParamsWith ? opt.shareParamsWith->compiled_ : std::make_shared<CompiledKernels>()),
      deterministic_(opt.deterministic), tf32_(opt.tf32), launch_(cuda::launchModeFor(opt.pdl, device.info())) {
  device_.makeCurrent();
  const std::vector<ValueId> packedGrads = planGradViews(opt);
  // The second stream's nodes may run until the end of run(), so their inputs live until then.
  std::vector<int64_t> inputsUntil;
  side_.assign(g.numNodes(), 0);
  if (opt.sideStream && !opt.adamInTrainNode) {
    side_ = codegen::secondStreamNodes(g, opt.sideStreamMaxFlops);
    inputsUntil.assign(g.numNodes(), -1);
    for (NodeId id : order_)
      if (side_[static_cast<size_t>(id)]) inputsUntil[static_cast<size_t>(id)] = static_cast<int64_t>(order_.size());
  }
  const MemoryPlan plan =
      planMemory(g, kArenaAlignFloats, /*aliasReshapes=*/true, /*storageSizes=*/true, packedGrads, inputsUntil);
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
  root_ = plan.root;
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
  planParamMirrors(opt);
  for (const auto& [grad, view] : gradViews_) skipped_[static_cast<size_t>(view.node)] = kGradView;
  planGatheredCast(opt);

  launches_.resize(g.numNodes());
  launchesAny_.assign(g.numNodes(), 0);
  std::vector<std::pair<FlashAttentionConfig, bool>> flashProblems;  // {config, backward} of every attention node
  const codegen::EmitOptions emit = emitOptionsFor(device_, opt);
  for (NodeId id : order_) {
    codegen::NodeKernels nk = codegen::emitNode(g, id, emit);
    const Node& n = g.node(id);
    if (nk.external) {
      launchesAny_[static_cast<size_t>(id)] = 1;  // the launcher's kernels
      if (!flash_) flash_ = std::make_unique<FlashAttention>(device_);
      const FlashAttentionConfig cfg = flashConfig(n);
      const bool backward = n.op == OpKind::FlashAttentionGrad || n.op == OpKind::FlashAttentionQkvGrad;
      flash_->validate(cfg, backward);
      flashProblems.emplace_back(cfg, backward);
      if (backward) scratch_.emplace(id, cuda::DeviceBuffer(std::max<size_t>(flash_->backwardWorkspaceBytes(cfg), 16)));
      continue;
    }
    // A reshape whose output shares its input's bytes has nothing to do, nor has a cast whose
    // output is another runner's mirror.
    const char skip = skipped_[static_cast<size_t>(id)];
    if (aliasedReshape(g, id, plan) || skip == kReadsOtherMirror || skip == kGradView || skip == kCastByCaller) continue;
    size_t scratchBytes = nk.scratchBytes;
    if (opt.tuneGemmTiles && opt.gemm != GemmProvider::Cublaslt && codegen::libraryGemmOf(g, id).supported)
      scratchBytes = std::max(scratchBytes, addTileVariants(id, nk, emit));
    if (scratchBytes > 0) scratch_.emplace(id, cuda::DeviceBuffer(scratchBytes));
    if (nk.zeroScratch) scratch_.at(id).fill32(0);
    for (codegen::Kernel& k : nk.kernels) {
      for (const codegen::KernelArg& a : k.args)
        if (a.kind == codegen::KernelArg::AdamBinding && adamBinding_.bytes() == 0) adamBinding_ = cuda::DeviceBuffer(sizeof(codegen::AdamBinding));
      Launch l;
      l.kernel = std::move(k);
      launches_[static_cast<size_t>(id)].push_back(std::move(l));
      ++kernelCount_;
    }
  }
  // A node that launches nothing (a reshape sharing its input's bytes, an unpacking left to Adam,
  // a cast another runner makes) neither forks the streams nor ends a run of second-stream nodes;
  // a side one still counts as the second stream's for the plan and the order. A GEMM node has
  // its generated launches whichever provider runs it. run() forks before the first second-stream
  // node of each run of them.
  forkBefore_.assign(g.numNodes(), 0);
  bool mainSinceFork = true;
  for (NodeId id : order_) {
    const size_t i = static_cast<size_t>(id);
    if (!launches_[i].empty() && !skipped_[i]) launchesAny_[i] = 1;  // (attention nodes: marked in the emit loop)
    if (!launchesAny_[i]) continue;
    if (!side_[i]) {
      mainSinceFork = true;
      continue;
    }
    ++sideNodes_;
    forkBefore_[i] = mainSinceFork;
    mainSinceFork = false;
  }
  if (sideNodes_ > 0) {
    sideStream_ = std::make_unique<cuda::Stream>(cuda::Stream::Priority::Least);
    fork_ = std::make_unique<cuda::Event>();
    join_ = std::make_unique<cuda::Event>();
  }
  opt_ = opt;
  flashProblems_ = std::move(flashProblems);
  if (!opt.deferCompile) compileTogether({this});
}

void CudaGraphRunner::compileTogether(const std::vector<CudaGraphRunner*>& runners) {
  if (runners.empty()) return;
  for (CudaGraphRunner* r : runners)
    if (r->ready_ || r->compiled_ != runners.front()->compiled_)
      throw std::logic_error("CudaGraphRunner::compileTogether: runners already compiled, or not sharing parameters");
  // The FlashAttention kernels compile beside the generated programs (and come from the same
  // cache), so that the first step compiles nothing; each runner's in turn, the later ones'
  // mostly from the memory cache.
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const Clock::time_point t0 = Clock::now();
  std::exception_ptr flashError, libraryError;  // (declared first: the threads outlive nothing they write)
  // Joined on every way out, an exception included (a thread the system refuses to start too).
  struct Joined {
    std::thread t;
    ~Joined() {
      if (t.joinable()) t.join();
    }
  } flashPrepare, library;
  flashPrepare.t = std::thread([&] {
    try {
      for (CudaGraphRunner* r : runners)
        if (r->flash_) r->flash_->prepare(r->flashProblems_);
    } catch (...) {
      flashError = std::current_exception();
    }
  });
  // cuBLASLt's plans (its library loads beside the session for a few tenths of a second) and the
  // timing of its candidates happen beside the compile too, on a thread of their own: the GPU is
  // idle while NVRTC runs. Until that thread is joined, compileKernels leaves library_ alone, and
  // the kernels the plans add (transposes, epilogues: light) compile after it.
  library.t = std::thread([&] {
    try {
      runners.front()->device_.makeCurrent();
      for (CudaGraphRunner* r : runners) r->planLibraryGemms(r->opt_);
      std::set<std::string> timed;
      for (CudaGraphRunner* r : runners) r->timeLibraryProducts(timed);
    } catch (...) {
      libraryError = std::current_exception();
    }
  });
  for (CudaGraphRunner* r : runners) r->compiledCount_ = r->programs_ = 0;
  compileKernels(runners, /*withLibrary=*/false);
  flashPrepare.t.join();
  const double compiling = since(t0);
  library.t.join();
  if (flashError) std::rethrow_exception(flashError);
  if (libraryError) std::rethrow_exception(libraryError);
  const Clock::time_point t1 = Clock::now();
  compileKernels(runners, /*withLibrary=*/true);  // only what the plans added is new
  // The wait for the plans is the session's "step plans", not compile time.
  runners.front()->compileSeconds_ = compiling + since(t1);
  for (CudaGraphRunner* r : runners) r->finish();
}

// Arguments are resolved once (the buffers never move); KernelParams keeps their addresses.
void CudaGraphRunner::resolveArguments() {
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    for (Launch* lp : nodeLaunches(id)) {
      Launch& l = *lp;
      auto sc = scratch_.find(id);  // every node whose kernels take a scratch has one
      l.params = launchParams(
          l.kernel, [&](int i) { return ptr(n.inputs[static_cast<size_t>(i)]); },
          [&](int i) { return ptr(n.outputs[static_cast<size_t>(i)]); }, sc != scratch_.end() ? sc->second.ptr() : 0,
          adamBinding_.bytes() > 0 ? adamBinding_.ptr() : 0);
    }
  }
}

void CudaGraphRunner::finish() {
  const Graph& g = g_;
  const CudaRunnerOptions& opt = opt_;
  resolveArguments();
  chooseGemmTiles();
  chooseGemmProviders(opt);
  baseLaunches_ = 0;  // plus the launcher's, counted by run()
  for (NodeId id : order_) {
    if (skipped_[static_cast<size_t>(id)]) continue;
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
    std::vector<float> host(static_cast<size_t>(count), static_cast<float>(n.attrs.get<attr::Value>()));
    if (n.attrs.has<attr::Data>()) {
      const std::vector<double> d = n.attrs.get<attr::Data>();
      std::copy(d.begin(), d.end(), host.begin());
    }
    upload(n.outputs[0], host.data());
  }
  ready_ = true;
}

// Note on compilation. A kernel is compiled once per distinct source: kernels whose sources
// differ only in their names (a transformer's layers repeat the same shapes, the validation
// graph's forward repeats the training graph's) share one compiled function, found by
// codegen::sourceWithoutName in the map the runners sharing parameters share. The session
// compiles its training and validation runners together, in one pool of threads (one per core,
// codegen::nvrtcAtOnce). Each kernel compiles under codegen::compiledName (its text less the
// banner, named by a hash of it), so that a program's cache key does not depend on how the graph
// numbered its nodes; the programs are small (codegen::splitIntoPrograms: each kernel on a GEMM
// main loop alone, taken first, so that the last to finish are short ones). The split depends
// only on the kernels, so the cache keys are stable from run to run.
void CudaGraphRunner::compileKernels(const std::vector<CudaGraphRunner*>& runners, bool withLibrary) {
  CompiledKernels& compiled = *runners.front()->compiled_;
  std::vector<Launch*> all;
  std::vector<std::string> keys;              // per launch: codegen::sourceWithoutName
  std::vector<Launch*> fresh;                 // the first launch of each source not compiled yet
  std::vector<size_t> freshAt;                // and where it stands in `all`
  std::unordered_set<std::string> seen;
  for (CudaGraphRunner* r : runners) {
    for (NodeId id : r->order_)
      for (Launch* l : r->nodeLaunches(id, withLibrary)) {
        all.push_back(l);
        keys.push_back(codegen::sourceWithoutName(l->kernel));
        if (compiled.bySource.count(keys.back()) || !seen.insert(keys.back()).second) continue;
        fresh.push_back(l);
        freshAt.push_back(all.size() - 1);
        ++r->compiledCount_;
      }
  }
  if (all.empty()) return;
  std::vector<const std::string*> freshKeys;
  for (size_t at : freshAt) freshKeys.push_back(&keys[at]);  // `keys` grows no more
  std::vector<const codegen::Kernel*> freshKernels;
  std::vector<std::string> names;  // what each fresh kernel compiles as (codegen::compiledName)
  std::unordered_map<std::string, const std::string*> keyOfName;
  for (size_t i = 0; i < fresh.size(); ++i) {
    freshKernels.push_back(&fresh[i]->kernel);
    names.push_back(codegen::compiledName(fresh[i]->kernel, *freshKeys[i]));
    if (!keyOfName.emplace(names.back(), freshKeys[i]).second)  // two sources, one hash
      throw std::runtime_error("kernels " + fresh[i]->kernel.name + " and another hash to one compiled name " + names.back());
  }
  const std::vector<std::vector<size_t>> programs = codegen::splitIntoPrograms(freshKernels);
  runners.front()->programs_ += static_cast<int>(programs.size());
  std::vector<std::string> sources(programs.size());
  for (size_t p = 0; p < programs.size(); ++p)
    for (size_t i : programs[p]) {
      fresh[i]->program = static_cast<int>(p);
      sources[p] += codegen::sourceNamed(*freshKeys[i], names[i]) + "\n";
    }
  std::vector<codegen::CompileResult> results(sources.size());
  const std::vector<std::pair<std::string, std::string>> headers = codegen::embeddedKernelHeaders();
  const std::string arch = runners.front()->device_.info().arch();
  codegen::compileEach(sources.size(), [&](size_t p) {
    try {
      codegen::CompileRequest req;
      req.kernelName = "graph part " + std::to_string(p + 1) + "/" + std::to_string(sources.size());
      req.source = sources[p];
      req.headers = headers;
      req.arch = arch;
      req.extraOptions = {"-lineinfo"};
      results[p] = codegen::KernelCache::instance().compile(req);
    } catch (const codegen::NvrtcError& e) {
      // Name the program's kernels and keep its source where the user can open it.
      std::string kernelNames;
      for (size_t i : programs[p]) kernelNames += (kernelNames.empty() ? "" : ", ") + fresh[i]->kernel.name + " as " + names[i];
      const std::filesystem::path path =
          std::filesystem::temp_directory_path() / ("pureattention-failed-part" + std::to_string(p + 1) + ".cu");
      std::ofstream(path) << sources[p];
      throw codegen::NvrtcError(kernelNames,
                                "does not compile (source: " + path.string() + "; --dump-kernels DIR writes each kernel alone)",
                                e.log());
    }
  });
  std::vector<cuda::CUmodule> modules(results.size(), nullptr);
  for (size_t p = 0; p < results.size(); ++p) {
    PA_CU_CHECK(cuModuleLoadData(&modules[p], results[p].cubin.data()));
    compiled.modules.push_back(modules[p]);
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    CompiledKernels::Entry e;
    PA_CU_CHECK(cuModuleGetFunction(&e.fn, modules[static_cast<size_t>(fresh[i]->program)], names[i].c_str()));
    compiled.bySource.emplace(*freshKeys[i], e);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    CompiledKernels::Entry& e = compiled.bySource.at(keys[i]);
    all[i]->fn = e.fn;
    const unsigned shared = all[i]->kernel.sharedBytes;
    if (shared > kDefaultSharedBytes && shared > e.sharedOptIn) {
      PA_CU_CHECK(cuFuncSetAttribute(e.fn, cuda::kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(shared)));
      e.sharedOptIn = shared;
    }
  }
}

std::vector<CudaGraphRunner::Launch*> CudaGraphRunner::nodeLaunches(NodeId id, bool withLibrary) {
  std::vector<Launch*> out;
  for (Launch& l : launches_[static_cast<size_t>(id)]) out.push_back(&l);
  if (auto it = tileVariants_.find(id); it != tileVariants_.end())
    for (std::vector<Launch>& variant : it->second)
      for (Launch& l : variant) out.push_back(&l);
  if (withLibrary)  // (library_ is another thread's until compileTogether has joined it)
    if (auto it = library_.find(id); it != library_.end()) {
      for (Launch& l : it->second.transpose) out.push_back(&l);
      for (Launch& l : it->second.post) out.push_back(&l);
    }
  return out;
}

CudaGraphRunner::~CudaGraphRunner() = default;

// The gathered input's cast (CudaRunnerOptions::gatheredInput). The caller writes the cast's output
// before run(), so no value a node computes earlier in the run may share its arena bytes (the plan
// lets a value that dies before the cast have them); otherwise the cast stays in the run.
void CudaGraphRunner::planGatheredCast(const CudaRunnerOptions& opt) {
  if (opt.gatheredInput == kNoValue) return;
  auto range = [&](ValueId v) {  // [first, end) in the arena's 4-byte units; empty outside the arena
    v = root_[static_cast<size_t>(v)];
    const int64_t at = offset_[static_cast<size_t>(v)];
    const int64_t units = (numel(g_.shape(v)) * static_cast<int64_t>(dtypeSize(g_.value(v).type.dtype)) + 3) / 4;
    return at < 0 ? std::make_pair(int64_t{0}, int64_t{0}) : std::make_pair(at, at + units);
  };
  std::vector<ValueId> earlier;  // outputs of the nodes that launch before the cast
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    if (n.op == OpKind::Cast && n.inputs[0] == opt.gatheredInput && g_.value(n.outputs[0]).type.dtype == DType::BF16) {
      const auto [first, end] = range(n.outputs[0]);
      for (ValueId v : earlier) {
        const auto [f, e] = range(v);
        if (f < end && first < e) return;
      }
      skipped_[static_cast<size_t>(id)] = kCastByCaller;
      gatheredCast_ = n.outputs[0];
      return;
    }
    if (skipped_[static_cast<size_t>(id)] == kRuns) earlier.insert(earlier.end(), n.outputs.begin(), n.outputs.end());
  }
}

// Note on parameter mirrors. Under precision bf16 every weight a GEMM or the attention kernels
// read gets a Cast to bf16 each step (passes/lower_bf16.cpp). Its input only changes where the
// parameter is written: by upload() from the host, and by the optimizer on the device. So the
// cast's output lives in `mirrors_` (one 256-byte-aligned slot per parameter, shared by every
// cast of it: they write the same bits), upload() reruns the casts, and the session's Adam
// kernel rounds each updated weight into its slot as it stores it, with the cast's rounding
// (to nearest, ties to even). The step then launches no cast of a parameter, and its results
// are bit for bit those of the step that did.
// The same holds for a node that packs parameters into one GEMM operand (fuse-qkv's Concat of the
// projection weights and of their biases, SwiGLU's Interleave of gate and up; mirrorPackedWeights),
// bf16 (each rounds as it stores, in place of a cast) or fp32: its output gets a slot, and each of
// its parameters a place in it (packedPlace_) where Adam stores the weight as the node would. A
// parameter with a cast's mirror, or in two packing nodes, is left to its nodes (Adam writes one
// copy of a weight).
void CudaGraphRunner::planParamMirrors(const CudaRunnerOptions& opt) {
  skipped_.assign(g_.numNodes(), 0);
  std::map<ValueId, int64_t> slot;  // owned parameter -> byte offset in mirrors_
  std::vector<std::pair<NodeId, ValueId>> owned;
  int64_t bytes = 0;
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    if (n.op != OpKind::Cast || g_.value(n.outputs[0]).type.dtype != DType::BF16) continue;
    const ValueId p = root_[static_cast<size_t>(n.inputs[0])];
    if (opt.mirrorParamCasts && paramOffset_.count(p)) {
      if (!slot.count(p)) {
        slot[p] = bytes;
        bytes += alignUp(numel(g_.shape(p)) * 2, 256);
      }
      owned.emplace_back(id, p);
    } else if (sharedParam_.count(p)) {
      const CudaGraphRunner& other = *opt.shareParamsWith;
      const cuda::CUdeviceptr m = other.paramMirror(other.g_.findValue(g_.value(p).name));
      if (!m) continue;
      mirrorPtr_[n.outputs[0]] = m;
      skipped_[static_cast<size_t>(id)] = kReadsOtherMirror;
    }
  }
  std::vector<std::pair<NodeId, int64_t>> packed;  // packing node -> byte offset of its output in mirrors_
  std::set<ValueId> packedParams;
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    const DType packedType = g_.value(n.outputs[0]).type.dtype;
    if (!opt.mirrorParamCasts || (n.op != OpKind::Concat && n.op != OpKind::Interleave) ||
        (packedType != DType::BF16 && packedType != DType::F32) || numel(g_.shape(n.outputs[0])) == 0)
      continue;
    bool ownsAll = true, sharesAll = true;
    std::set<ValueId> seen;
    for (ValueId in : n.inputs) {
      const ValueId p = root_[static_cast<size_t>(in)];
      // An fp32 value with values, each parameter once in the node.
      const bool eligible = g_.value(p).type.dtype == DType::F32 && numel(g_.shape(in)) > 0 && seen.insert(p).second;
      ownsAll &= eligible && paramOffset_.count(p) && !slot.count(p) && !packedParams.count(p);
      sharesAll &= eligible && sharedParam_.count(p) > 0;
    }
    if (ownsAll && opt.mirrorPackedWeights) {
      packed.emplace_back(id, bytes);
      bytes += alignUp(numel(g_.shape(n.outputs[0])) * static_cast<int64_t>(dtypeSize(packedType)), 256);
      packedParams.insert(seen.begin(), seen.end());
    } else if (sharesAll) {
      auto it = opt.shareParamsWith->packedByKey_.find(packedKey(n));
      if (it == opt.shareParamsWith->packedByKey_.end()) continue;
      mirrorPtr_[n.outputs[0]] = it->second;
      skipped_[static_cast<size_t>(id)] = kReadsOtherMirror;
    }
  }
  if (bytes == 0) return;
  mirrors_ = cuda::DeviceBuffer(static_cast<size_t>(bytes));
  mirrors_.fill32(0);
  for (const auto& [p, at] : slot) paramMirror_[p] = mirrors_.ptr() + static_cast<cuda::CUdeviceptr>(at);
  for (const auto& [id, p] : owned) {
    mirrorPtr_[g_.node(id).outputs[0]] = paramMirror_.at(p);
    mirrorCasts_[p].push_back(id);
    skipped_[static_cast<size_t>(id)] = kWritesMirror;
  }
  for (const auto& [id, at] : packed) {
    const Node& n = g_.node(id);
    const cuda::CUdeviceptr base = mirrors_.ptr() + static_cast<cuda::CUdeviceptr>(at);
    mirrorPtr_[n.outputs[0]] = base;
    packedByKey_[packedKey(n)] = base;
    skipped_[static_cast<size_t>(id)] = kWritesMirror;
    const int64_t width = g_.shape(n.outputs[0]).back(), eb = static_cast<int64_t>(dtypeSize(g_.value(n.outputs[0]).type.dtype));
    int64_t column = 0;  // Concat: the input's first column in the packed rows
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId p = root_[static_cast<size_t>(n.inputs[i])];
      PackedPlace place;
      if (n.op == OpKind::Concat) {  // value i of input [..., N] at row (i / N), column `column` + i % N
        const int64_t cols = g_.shape(n.inputs[i]).back();
        place = {base + static_cast<cuda::CUdeviceptr>(column * eb), cols, width, 1, eb};
        column += cols;
      } else {  // Interleave: input k's value i at 2i + k
        place = {base + static_cast<cuda::CUdeviceptr>(i * eb), numel(g_.shape(p)), 0, 2, eb};
      }
      packedPlace_[p] = place;
      mirrorCasts_[p].push_back(id);
    }
  }
}

// packedGradViews: each parameter gradient that a node only unpacks from a packed one
// (unpackingOfParamGradient); returns the packed gradients, which must live to the end of the run.
std::vector<ValueId> CudaGraphRunner::planGradViews(const CudaRunnerOptions& opt) {
  std::vector<ValueId> packed;
  if (!opt.packedGradViews) return packed;
  const std::vector<std::vector<NodeId>> users = g_.users();
  for (ValueId p : g_.params()) {
    const NodeId unpack = unpackingOfParamGradient(g_, p, users);
    if (unpack < 0) continue;
    const Node& n = g_.node(unpack);
    const ValueId grad = n.outputs[0], x = n.inputs[0];
    const int64_t width = g_.shape(x).back();
    GradView v{unpack, x, 0, 0, 0, 0};
    if (n.op == OpKind::Slice) {  // value j of [..., L] at row j / L, column start + j % L of [..., W]
      v.first = n.attrs.get<attr::Start>(), v.cols = n.attrs.get<attr::Length>(), v.rowStride = width, v.step = 1;
    } else {  // part k: value j at 2j + k
      v.first = n.attrs.get<attr::Part>(), v.cols = numel(g_.shape(grad)), v.rowStride = 0, v.step = 2;
    }
    gradViews_[grad] = v;
    packed.push_back(x);
  }
  return packed;
}

CudaGraphRunner::PackedPlace CudaGraphRunner::packedGrad(ValueId grad) const {
  auto it = gradViews_.find(grad);
  if (it == gradViews_.end()) return PackedPlace{};
  const GradView& v = it->second;
  return PackedPlace{ptr(v.packed) + static_cast<cuda::CUdeviceptr>(v.first) * sizeof(float), v.cols, v.rowStride, v.step, 4};
}

// A packing node by what it packs: its op and its parameters' names, in order (the training and
// the validation graph name a parameter alike).
std::string CudaGraphRunner::packedKey(const Node& n) const {
  std::string key = opName(n.op);
  for (ValueId in : n.inputs) key += "|" + g_.value(root_[static_cast<size_t>(in)]).name;
  return key;
}

cuda::CUdeviceptr CudaGraphRunner::paramMirror(ValueId p) const {
  auto it = paramMirror_.find(p);
  return it == paramMirror_.end() ? 0 : it->second;
}

CudaGraphRunner::PackedPlace CudaGraphRunner::packedMirror(ValueId p) const {
  auto it = packedPlace_.find(p);
  return it == packedPlace_.end() ? PackedPlace{} : it->second;
}

void CudaGraphRunner::refreshMirror(ValueId param) {
  auto it = mirrorCasts_.find(param);
  if (it == mirrorCasts_.end()) return;
  for (NodeId id : it->second)  // set-up on the legacy stream, not the step: plain launches
    for (const Launch& l : launches_[static_cast<size_t>(id)]) l.enqueue(nullptr, cuda::LaunchMode::Plain);
  PA_CU_CHECK(cuCtxSynchronize());
}

int64_t CudaGraphRunner::paramOffset(ValueId p) const {
  auto it = paramOffset_.find(p);
  return it == paramOffset_.end() ? -1 : it->second;
}

cuda::CUdeviceptr CudaGraphRunner::ptr(ValueId v) const {
  v = root_[static_cast<size_t>(v)];  // an aliased reshape: its input's bytes (a parameter's, or the arena's)
  if (auto m = mirrorPtr_.find(v); m != mirrorPtr_.end()) return m->second;
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
  refreshMirror(v);
}

void CudaGraphRunner::download(ValueId v, float* host) const {
  PA_CU_CHECK(cuCtxSynchronize());
  const size_t count = static_cast<size_t>(numel(g_.shape(v)));
  if (auto it = gradViews_.find(v); it != gradViews_.end()) {  // left in its packed gradient (packedGradViews)
    const GradView& gv = it->second;
    std::vector<float> all(static_cast<size_t>(numel(g_.shape(gv.packed))));
    download(gv.packed, all.data());
    for (size_t j = 0; j < count; ++j)
      host[j] = all[static_cast<size_t>(gv.first + static_cast<int64_t>(j) / gv.cols * gv.rowStride +
                                        static_cast<int64_t>(j) % gv.cols * gv.step)];
    return;
  }
  if (g_.value(v).type.dtype == DType::BF16) {
    std::vector<uint16_t> bits(count);
    PA_CU_CHECK(cuMemcpyDtoH(bits.data(), ptr(v), count * sizeof(uint16_t)));
    for (size_t i = 0; i < count; ++i) host[i] = bf16Value(bits[i]);
    return;
  }
  PA_CU_CHECK(cuMemcpyDtoH(host, ptr(v), count * sizeof(float)));
}

void CudaGraphRunner::bindAdam(const codegen::AdamBinding& b) {
  if (!takesAdam()) throw std::logic_error("CudaGraphRunner::bindAdam: no kernel applies Adam");
  adamBinding_.upload(&b, sizeof b);
  adamBound_ = true;
}

void CudaGraphRunner::run(cuda::CUstream stream) {
  if (!ready_) throw std::logic_error("CudaGraphRunner::run before compileTogether");
  if (takesAdam() && !adamBound_) throw std::logic_error("CudaGraphRunner::run: a kernel applies Adam, and bindAdam was not called");
  const int64_t flashBefore = flash_ ? flash_->launches() : 0;
  if (sideNodes_ == 0) {
    for (NodeId id : order_) runNode(id, stream, launch_);
  } else {
    // A second-stream node waits for everything queued on `stream` before it (one wait for a
    // run of them); the second stream's kernels go out plain, each behind a wait or a library call.
    const cuda::CUstream side = sideStream_->get();
    for (NodeId id : order_) {
      const size_t i = static_cast<size_t>(id);
      if (!launchesAny_[i]) continue;
      if (!side_[i]) {
        runNode(id, stream, launch_);
        continue;
      }
      if (forkBefore_[i]) {
        fork_->record(stream);
        sideStream_->wait(fork_->get());
      }
      runNode(id, side, cuda::LaunchMode::Plain);
    }
    join_->record(side);
    PA_CU_CHECK(cuStreamWaitEvent(stream, join_->get(), 0));
  }
  launchesPerRun_ = baseLaunches_ + static_cast<int>((flash_ ? flash_->launches() : 0) - flashBefore);
}

std::vector<CudaGraphRunner::NodeTime> CudaGraphRunner::profile(cuda::CUstream stream, int reps) {
  if (!ready_) throw std::logic_error("CudaGraphRunner::profile before compileTogether");
  std::vector<NodeId> timed;
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    if (skipped_[static_cast<size_t>(id)]) continue;
    if (!launches_[static_cast<size_t>(id)].empty() || library_.count(id) || n.op == OpKind::FlashAttention ||
        n.op == OpKind::FlashAttentionGrad || codegen::flashPackedQkv(n))
      timed.push_back(id);
  }
  std::vector<std::unique_ptr<cuda::Event>> events;
  for (size_t i = 0; i <= timed.size(); ++i) events.push_back(std::make_unique<cuda::Event>(true));
  std::vector<std::vector<float>> ms(timed.size());
  for (int r = 0; r < reps; ++r) {
    for (NodeId id : order_)
      if (std::find(timed.begin(), timed.end(), id) == timed.end()) runNode(id, stream, cuda::LaunchMode::Plain);
    events[0]->record(stream);
    for (size_t i = 0; i < timed.size(); ++i) {
      runNode(timed[i], stream, cuda::LaunchMode::Plain);
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

// flash-attention-qkv(-grad): Q, K and V (and dQ, dK, dV) are strided views of one packed
// [B, S, Hq + 2 Hk, D] buffer: heads [0, Hq), [Hq, Hq + Hk) and [Hq + Hk, Hq + 2 Hk), each row
// (Hq + 2 Hk)·D elements long. fuse-qkv builds the node only where D is a multiple of 8, so every
// view's base and strides are multiples of 16 bytes, as the kernels' cp.async loads need.
void CudaGraphRunner::runPackedFlash(NodeId id, cuda::CUstream stream, cuda::LaunchMode mode) {
  const Node& n = g_.node(id);
  const FlashAttentionConfig cfg = flashConfig(n);
  const long long d = cfg.headDim, row = static_cast<long long>(cfg.heads + 2 * cfg.kvHeads) * d;
  const unsigned long long elem = cfg.dtype == kFlashF32 ? 4 : 2;
  auto packed = [&](ValueId v, int firstHead) {
    FlashTensor t;
    t.ptr = ptr(v) + static_cast<unsigned long long>(firstHead) * d * elem;
    t.seqStride = row;
    t.headStride = d;
    t.batchStride = row * cfg.qLen;
    return t;
  };
  auto out = [&](ValueId v) {  // o and dO in the node's layout
    FlashTensor t = FlashTensor::contiguous(ptr(v), cfg.heads, cfg.qLen, cfg.headDim);
    if (codegen::flashLayoutBshd(n)) {
      t.headStride = d;
      t.seqStride = static_cast<long long>(cfg.heads) * d;
    }
    return t;
  };
  const ValueId qkv = n.inputs[0];
  if (n.op == OpKind::FlashAttentionQkv) {
    FlashForwardArgs a;
    a.q = packed(qkv, 0);
    a.k = packed(qkv, cfg.heads);
    a.v = packed(qkv, cfg.heads + cfg.kvHeads);
    a.o = out(n.outputs[0]);
    a.lse = ptr(n.outputs[1]);
    if (cfg.sinkLogits) a.sinkLogits = ptr(n.inputs[1]);
    flash_->forward(cfg, a, stream, flashMode(mode));
    return;
  }
  FlashBackwardArgs a;
  a.q = packed(qkv, 0);
  a.k = packed(qkv, cfg.heads);
  a.v = packed(qkv, cfg.heads + cfg.kvHeads);
  a.o = out(n.inputs[1]);
  a.lse = ptr(n.inputs[2]);
  a.dO = out(n.inputs[3]);
  const ValueId dqkv = n.outputs[0];
  a.dQ = packed(dqkv, 0);
  a.dK = packed(dqkv, cfg.heads);
  a.dV = packed(dqkv, cfg.heads + cfg.kvHeads);
  if (cfg.sinkLogits) {
    a.sinkLogits = ptr(n.inputs[4]);
    a.dSinkLogits = ptr(n.outputs[1]);
  }
  a.workspace = scratch_.at(id).ptr();
  flash_->backward(cfg, a, stream, flashMode(mode));
}

void CudaGraphRunner::runNode(NodeId id, cuda::CUstream stream, cuda::LaunchMode mode) {
  if (skipped_[static_cast<size_t>(id)]) return;
  const Node& n = g_.node(id);
  if (codegen::flashPackedQkv(n)) {
    runPackedFlash(id, stream, mode);
    return;
  }
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
      flash_->forward(cfg, a, stream, flashMode(mode));
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
      flash_->backward(cfg, a, stream, flashMode(mode));
    }
    return;
  }
  if (auto it = library_.find(id); it != library_.end() && it->second.use) {
    runLibrary(id, it->second, stream, mode);
    return;
  }
  for (const Launch& l : launches_[static_cast<size_t>(id)]) l.enqueue(stream, mode);
}

codegen::EmitOptions CudaGraphRunner::emitOptionsFor(const cuda::Device& device, const CudaRunnerOptions& opt) {
  codegen::EmitOptions emit;
  emit.tf32 = opt.tf32;
  emit.adamInTrainNode = opt.adamInTrainNode;
  if (!opt.fp64Gemm) emit.fp32Gemm = codegen::Fp32Gemm::Simt;
  emit.wgmmaEpilogue = opt.wgmmaEpilogue;
  emit.wgmmaTmaStores = opt.wgmmaTmaStores;
  emit.wgmma = device.info().arch() == "sm_90a";
  emit.fullRateFp64 = flashTargetOf(device.info()).fullRateFp64;
  emit.sms = device.info().multiprocessors;
  return emit;
}


CudaModule::CudaModule(const std::string& source, const cuda::Device& device) {
  device.makeCurrent();
  codegen::CompileRequest req;
  req.kernelName = "module";
  req.source = source;
  req.headers = codegen::embeddedKernelHeaders();  // kernels/pdl.cuh, and whatever else it includes
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

cuda::LaunchShape CudaModule::shapeFor(int64_t work) {
  cuda::LaunchShape shape;
  shape.grid[0] = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + 255) / 256, 65535 * 8)));
  shape.block[0] = 256;
  return shape;
}

void CudaModule::launch(cuda::CUfunction fn, int64_t work, void** args, cuda::CUstream stream, cuda::LaunchMode mode) {
  cuda::launchKernel(fn, shapeFor(work), stream, args, mode);
}

}  // namespace pa

