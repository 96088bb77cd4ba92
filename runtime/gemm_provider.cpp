// The GEMM provider choice of the CUDA graph runner: cuBLASLt plans for the GEMM nodes, the
// generated tile variants, and which of them runs each node, measured at start and cached
// (runtime/autotune_cache.h).
#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

#include "codegen/emit.h"
#include "codegen/kernel_cache.h"
#include "runtime/autotune_cache.h"
#include "runtime/cuda_graph_runner_internal.h"

namespace pa {

namespace {

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

}  // namespace

// The other tile variants of generated GEMM node `id` (see chooseGemmTiles) beside `chosen`, the
// emitter's pick; a variant that emits what the pick or an earlier variant does is not a
// candidate (PingPong emits Medium where ping-pong consumers do not apply). Returns the largest
// scratch a variant needs.
size_t CudaGraphRunner::addTileVariants(NodeId id, const codegen::NodeKernels& chosen, const codegen::EmitOptions& emit) {
  size_t scratchBytes = 0;
  auto text = [](const codegen::NodeKernels& k) {
    std::string t;
    for (const codegen::Kernel& kk : k.kernels) t += kk.source;
    return t;
  };
  std::set<std::string> texts{text(chosen)};
  int index = 0;
  for (codegen::GemmTile tile :
       {codegen::GemmTile::Large, codegen::GemmTile::Medium, codegen::GemmTile::Small, codegen::GemmTile::PingPong}) {
    codegen::EmitOptions alt = emit;
    alt.gemmTile = tile;
    if (!texts.insert(text(codegen::emitNode(g_, id, alt))).second) continue;
    alt.kernelSuffix = "_v" + std::to_string(++index);
    codegen::NodeKernels ak = codegen::emitNode(g_, id, alt);
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
  return scratchBytes;
}

std::string CudaGraphRunner::gemmProviderOf(NodeId id) const {
  auto it = library_.find(id);
  if (it != library_.end() && it->second.use) return "cublaslt";
  return codegen::libraryGemmOf(g_, id).supported ? "generated" : "";
}

// cuBLASLt's product is its own launch (plain to us); the transpose and epilogue kernels around it
// are ours, in `mode`.
void CudaGraphRunner::runLibrary(NodeId id, const LibraryNode& l, cuda::CUstream stream, cuda::LaunchMode mode) {
  if (l.transposed)
    for (const Launch& k : l.transpose) k.enqueue(stream, mode);
  runProduct(id, l, l.transposed, l.algo, stream);
  for (const Launch& k : l.post) k.enqueue(stream, mode);
}

void CudaGraphRunner::runProduct(NodeId id, const LibraryNode& l, bool transposed, const cuda::LtAlgo& algo,
                                 cuda::CUstream stream) const {
  const Node& n = g_.node(id);
  const cuda::LtPlan& plan = transposed ? *l.planT : *l.plan;
  const cuda::LtProblem& lp = plan.problem();
  const cuda::CUdeviceptr bias = lp.bias ? ptr(n.inputs[2]) : lp.biasGradA || lp.biasGradB ? ptr(n.outputs[1]) : 0;
  plan.run(algo, ptr(n.inputs[0]), transposed ? scratch_.at(id).ptr() : ptr(n.inputs[1]), bias,
           ptr(n.outputs[static_cast<size_t>(l.output)]),
           sideStream_ && stream == sideStream_->get() ? ltSideWorkspace_.ptr() : ltWorkspace_.ptr(), stream);
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
    // (bias or bias gradient, ReLU), fewest kernels first. A bias gradient cuBLASLt offers no
    // algorithm for (an operand type or transpose its BGRAD epilogues lack) is left to the
    // column-sum kernels of libraryGemmEpilogue.
    const bool biasGrad = lg.biasGradOf >= 0;
    std::vector<std::pair<bool, bool>> levels{{lg.bias || biasGrad, lg.relu}};
    if (lg.relu) levels.push_back({lg.bias, false});
    if (lg.bias || biasGrad) levels.push_back({false, false});
    std::unique_ptr<cuda::LtPlan> plan;
    for (const auto& [bias, relu] : levels) {
      p.bias = bias && !biasGrad;
      p.biasGradB = bias && lg.biasGradOf == 1;
      p.biasGradA = bias && lg.biasGradOf == 0;
      p.relu = relu;
      plan = lt.plan(p, kLtWorkspaceBytes, kLtCandidates);
      if (!plan->candidates().empty()) break;
    }
    if (plan->candidates().empty()) continue;  // cuBLASLt cannot run it: the generated kernels do
    LibraryNode l;
    l.output = lg.output;
    const cuda::LtProblem& planned = plan->problem();
    codegen::NodeKernels post =
        codegen::libraryGemmEpilogue(g_, id, planned.bias || planned.biasGradA || planned.biasGradB, planned.relu);
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
  for (const auto& kv : library_)
    if (side_[static_cast<size_t>(kv.first)]) {
      ltSideWorkspace_ = cuda::DeviceBuffer(kLtWorkspaceBytes);
      break;
    }
}

std::string CudaGraphRunner::providerKey(NodeId id, const std::vector<Launch>& generated) const {
  const cuda::CublasLt& lt = cuda::CublasLt::instance();
  const LibraryNode& l = library_.at(id);
  std::string generatedSource;
  for (const Launch& k : generated) generatedSource += codegen::sourceWithoutName(k.kernel);
  return device_.info().name + "|" + std::to_string(device_.info().multiprocessors) + "|lt" + std::to_string(lt.version()) +
         "|" + gemmProviderName(opt_.gemm) + "|" + l.plan->problem().describe() + "|post" + std::to_string(l.post.size()) +
         "|gen" + codegen::contentHash(generatedSource);
}

double CudaGraphRunner::timeGenerated(cuda::Stream& stream, const std::vector<Launch>& launches) {
  fillForTuning(stream);
  return measure(stream, [&](cuda::CUstream st) {
    for (const Launch& k : launches) k.enqueue(st, launch_);
  });
}

CudaGraphRunner::LibraryTiming CudaGraphRunner::timeLibrary(NodeId id, cuda::Stream& stream) {
  fillForTuning(stream);
  LibraryNode& l = library_.at(id);
  const auto early = productBest_.find(id);
  LibraryTiming best;
  for (bool t : {false, true}) {
    if ((t && !l.planT) || (!t && l.planT && opt_.forceTransposedB)) continue;
    l.transposed = t;
    const bool one = !t && early != productBest_.end();
    const std::vector<cuda::LtAlgo> algos = one ? std::vector<cuda::LtAlgo>{early->second.algo} : (t ? l.planT : l.plan)->candidates();
    bool ran = false;
    for (const cuda::LtAlgo& algo : algos) {
      if (algo.workspaceBytes > kLtWorkspaceBytes) continue;
      l.algo = algo;
      double ms = 1e30;
      try {
        ms = measure(stream, [&](cuda::CUstream st) { runLibrary(id, l, st, launch_); });
      } catch (const cuda::CudaError&) {
        continue;  // a candidate that fails to launch is not a candidate
      }
      ran = true;
      if (best.ms < 0 || ms < best.ms) best.ms = ms, best.algo = algo, best.transposed = t;
    }
    if (one && !ran) {  // the product's fastest failed as the whole node: the others, as before
      productBest_.erase(id);
      return timeLibrary(id, stream);
    }
  }
  return best;
}

// Note on the provider choice. With compiler.gemm: auto, each GEMM node runs on whichever of
// the generated kernels and cuBLASLt's heuristic candidates is fastest for its own shape; with
// cublaslt, the fastest candidate. Each candidate is measured as the whole node (product and
// epilogue kernels) on the node's own buffers filled with fresh random values (the arena holds
// nothing yet: parameters and constants are uploaded afterwards), replayed from a CUDA graph so
// that the launch cost of the host does not count, as in the captured training step: a warm-up
// run, then the median of 5 replays of enough runs to last ~0.5 ms. The choice is cached under
// the device, cuBLASLt's version, the problem and the generated kernels' sources less their
// banners and names (codegen::sourceWithoutName), so that a node repeating another's GEMM (a
// transformer's layers) takes the choice measured for the first.
void CudaGraphRunner::chooseGemmProviders(const CudaRunnerOptions& opt) {
  if (library_.empty()) {
    for (NodeId id : order_) gemmStats_.generated += codegen::libraryGemmOf(g_, id).supported ? 1 : 0;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  cuda::Stream stream;
  for (NodeId id : order_) {
    const bool gemmNode = codegen::libraryGemmOf(g_, id).supported;
    auto it = library_.find(id);
    if (it == library_.end()) {
      gemmStats_.generated += gemmNode ? 1 : 0;
      continue;
    }
    LibraryNode& l = it->second;
    const std::string key = providerKey(id, launches_[static_cast<size_t>(id)]);
    GemmChoice choice;
    choice.node = id;
    {
      const cuda::LtProblem& lp = l.plan->problem();
      choice.label = "k" + std::to_string(id) + " " + opName(g_.node(id).op) + " " + std::to_string(lp.m) + "x" +
                     std::to_string(lp.n) + "x" + std::to_string(lp.k) +
                     (lp.batch > 1 ? " batch " + std::to_string(lp.batch) : std::string()) + " " + (lp.transA ? "T" : "N") +
                     (lp.transB ? "T" : "N");
    }
    if (auto p = pickMs_.find(id); p != pickMs_.end()) choice.pickMs = p->second;
    bool decided = false;
    const std::optional<AutotuneEntry> cached = opt.forceTransposedB ? std::nullopt : AutotuneCache::instance().find(key);
    if (cached) {
      cuda::LtAlgo algo;
      const bool library = cached->kind == AutotuneEntry::Kind::Cublaslt && cuda::LtAlgo::fromHex(cached->algo, algo);
      if (cached->kind == AutotuneEntry::Kind::Generated && opt.gemm == GemmProvider::Auto) {
        l.use = false;
        decided = true;
      } else if (library && !cached->transposedB && l.plan->check(algo)) {
        l.use = true;
        l.algo = algo;
        decided = true;
      } else if (library && cached->transposedB && l.planT && l.planT->check(algo)) {
        l.use = l.transposed = true;
        l.algo = algo;
        decided = true;
      }
      gemmStats_.cached += decided ? 1 : 0;
      choice.cached = decided;
    }
    if (!decided) {
      // What chooseGemmTiles measured stands (the same kernels on the same buffers).
      double generated = 1e30;
      if (opt.gemm == GemmProvider::Auto) {
        auto g = generatedMs_.find(id);
        generated = choice.generatedMs =
            g != generatedMs_.end() ? g->second : timeGenerated(stream, launches_[static_cast<size_t>(id)]);
      }
      const LibraryTiming lib = timeLibrary(id, stream);
      choice.libraryMs = lib.ms;
      l.use = lib.ms >= 0 && lib.ms < generated;
      l.transposed = l.use && lib.transposed;
      l.algo = l.use ? lib.algo : cuda::LtAlgo{};
      ++gemmStats_.measured;
      if (!opt.forceTransposedB) {
        AutotuneEntry entry;
        if (l.use) entry.kind = AutotuneEntry::Kind::Cublaslt, entry.algo = l.algo.hex(), entry.transposedB = l.transposed;
        AutotuneCache::instance().put(key, entry);
      }
    }
    choice.library = l.use;
    choice.transposedB = l.use && l.transposed;
    gemmChoices_.push_back(choice);
    if (l.use) {  // cuBLASLt may queue more than one kernel (a split-K reduce): count them
      cuda::CapturedGraph one;
      one.capture(stream, [&] { runLibrary(id, l, stream.get(), launch_); });
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

void CudaGraphRunner::fillForTuning(cuda::Stream& stream) {
  if (tuningFilled_) return;
  tuningFilled_ = true;
  CudaModule fillModule(kFillSource, device_);
  const cuda::CUfunction f = fillModule.function("pa_fill_uniform");
  unsigned seed = 0x9e3779b9u;
  for (const cuda::DeviceBuffer* b : {&arena_, &params_, &mirrors_}) {
    if (b->bytes() == 0) continue;
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
// values, CUDA-graph replays, median), keeping the fastest in launches_ (and its time for the
// provider choice). The choice is cached in the autotune cache under the device, its SM count
// and a hash of every candidate's source less its banner and name (codegen::sourceWithoutName: a
// layer repeating another's GEMM takes the choice measured for the first), as the winner's index
// (0: the emitter's pick). Variants that lose stay compiled but never run.
std::string CudaGraphRunner::tileKey(NodeId id) const {
  std::string sources;
  for (const Launch& l : launches_[static_cast<size_t>(id)]) sources += codegen::sourceWithoutName(l.kernel);
  for (const std::vector<Launch>& v : tileVariants_.at(id))
    for (const Launch& l : v) sources += codegen::sourceWithoutName(l.kernel);
  return device_.info().name + "|" + std::to_string(device_.info().multiprocessors) + "|tiles|" + codegen::contentHash(sources);
}

// The cached tile winner of a node with variants: 0 (the emitter's pick) to the variant count,
// or -1 where none is cached.
int CudaGraphRunner::cachedTiles(NodeId id) const {
  const std::optional<AutotuneEntry> cached = AutotuneCache::instance().find(tileKey(id));
  if (cached && cached->kind == AutotuneEntry::Kind::Tiles && cached->tiles >= 0 &&
      static_cast<size_t>(cached->tiles) <= tileVariants_.at(id).size())
    return cached->tiles;
  return -1;
}

void CudaGraphRunner::chooseGemmTiles() {
  if (tileVariants_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  cuda::Stream stream;
  for (auto& [id, variants] : tileVariants_) {
    std::vector<Launch>& chosen = launches_[static_cast<size_t>(id)];
    size_t best = 0;
    if (const int cached = cachedTiles(id); cached >= 0) {
      best = static_cast<size_t>(cached);
      ++gemmStats_.tilesCached;
    } else {
      double bestMs = pickMs_[id] = timeGenerated(stream, chosen);
      for (size_t i = 0; i < variants.size(); ++i) {
        const double ms = timeGenerated(stream, variants[i]);
        if (ms < bestMs) bestMs = ms, best = i + 1;
      }
      generatedMs_[id] = bestMs;
      AutotuneEntry entry;
      entry.kind = AutotuneEntry::Kind::Tiles;
      entry.tiles = static_cast<int>(best);
      AutotuneCache::instance().put(tileKey(id), entry);
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

// Note on timing cuBLASLt beside the compile. Its candidates need no kernel of ours, so while
// NVRTC compiles (seconds on a cold cache, the GPU idle) a thread times each candidate's product
// alone for every node whose provider choice is not cached (under the tiles the cache says will
// run; the emitter's pick where none is cached), once per key over the runners compiled
// together (`timed`: the later nodes find the first one's choice cached). The provider choice
// then times only the fastest as the whole node (with the epilogue kernels around it, the same
// for every candidate). The candidates on a copied transposed B are left to the provider choice
// (the copy kernel is ours).
void CudaGraphRunner::timeLibraryProducts(std::set<std::string>& timed) {
  if (library_.empty() || opt_.forceTransposedB) return;
  std::optional<cuda::Stream> stream;
  for (const auto& [id, l] : library_) {
    const std::vector<Launch>* generated = &launches_[static_cast<size_t>(id)];
    if (tileVariants_.count(id))
      if (const int cached = cachedTiles(id); cached > 0) generated = &tileVariants_.at(id)[static_cast<size_t>(cached) - 1];
    const std::string key = providerKey(id, *generated);
    // A node repeating another's problem and kernels takes the other's choice from the cache.
    if (AutotuneCache::instance().find(key) || !timed.insert(key).second) continue;
    if (!stream) {
      stream.emplace();
      fillForTuning(*stream);
    }
    LibraryTiming best;
    for (const cuda::LtAlgo& algo : l.plan->candidates()) {
      if (algo.workspaceBytes > kLtWorkspaceBytes) continue;
      double ms = 0;
      try {
        ms = measure(*stream, [&](cuda::CUstream st) { runProduct(id, l, false, algo, st); });
      } catch (const cuda::CudaError&) {
        continue;  // a candidate that fails to launch is not a candidate
      }
      if (best.ms < 0 || ms < best.ms) best.ms = ms, best.algo = algo;
    }
    if (best.ms >= 0) productBest_[id] = best, ++gemmStats_.timedBeside;
  }
  if (stream) stream->synchronize();
}

}  // namespace pa
