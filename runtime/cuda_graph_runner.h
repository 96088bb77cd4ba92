// Runs a whole graph on a CUDA device with the generated kernels (and the FlashAttention
// launcher for its nodes): the GPU counterpart of CpuExecutor<float>.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "codegen/flops.h"
#include "codegen/training_kernels.h"
#include "common/settings.h"
#include "graph/graph.h"
#include "runtime/flash_attention.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/launch.h"

namespace pa {

namespace cuda {
struct LtAlgo;
}

struct CudaRunnerOptions {
  bool tf32 = false;  // MatMul, FusedLinear and fp32 attention on TF32 tensor cores (precision: tf32)
  GemmProvider gemm = GemmProvider::Generated;
  // Generated GEMMs: besides the tiles the emitter picks from the shape, compile the other tile
  // variants and keep the fastest, measured at start and cached (compiler.gemm generated and
  // auto; the choice between the generated kernel and cuBLASLt then sees the fastest tiles).
  bool tuneGemmTiles = true;
  // No kernel with atomics, so a step's results are bit-reproducible for a given kernel choice
  // (compiler.deterministic): FlashAttention's fp32 backward then gives dQ its own kernel where it
  // would add it with atomics.
  bool deterministic = false;
  // Tests: cuBLASLt runs every transposed-B product it can on an untransposed copy of B.
  bool forceTransposedB = false;
  // Parameters with the same name live in that runner's buffers instead of new ones (the
  // validation graph reads the training graph's weights in place).
  const class CudaGraphRunner* shareParamsWith = nullptr;
  // precision bf16: a Cast of a parameter to bf16 (the tensor cores' copy of a weight) writes a
  // persistent mirror instead of an arena value, and run() skips it. The mirror is refreshed by
  // upload() of the parameter; whoever changes the parameter on the device writes it too
  // (CudaSession's Adam, through paramMirror). A runner sharing this one's parameters reads
  // its mirrors in place of its own casts.
  bool mirrorParamCasts = false;
  // With mirrorParamCasts: a Concat (fuse-qkv's projection weights and biases) or an Interleave
  // (SwiGLU's gate and up weights) whose every input is a parameter, stored bf16 or fp32, also
  // writes a persistent mirror that run() skips: the packed copy. Adam stores each updated weight
  // into its place in it (packedMirror), rounded as the node rounds; upload() reruns the node.
  // Results are the same bits either way (tests, A/B).
  bool mirrorPackedWeights = true;
  // A parameter's gradient that is a Slice (fuse-qkv's projection weights) or a Deinterleave
  // (SwiGLU's gate and up weights) of a packed gradient, read by nothing else, is not computed:
  // the packed gradient lives to the end of the run and Adam reads each value at its place there
  // (packedGrad). Only for a caller that reads gradients through packedGrad (CudaSession without
  // NCCL: its all-reduce needs every gradient whole). Results are the same bits either way.
  bool packedGradViews = false;
  // The input the caller fills before each run() (CudaSession's batch gather of x): a Cast of it
  // to bf16 (precision bf16) whose output no value computed earlier in the run shares arena bytes
  // with is left to the caller, who writes that output (gatheredCast) with the same rounding;
  // run() skips the cast. kNoValue: none.
  ValueId gatheredInput = kNoValue;
  // Launch the step's kernels as programmatic dependents where the device and driver allow
  // (sm_90+, runtime/cuda/launch.h): each may start while the one before it finishes. Off: every
  // kernel plain (A/B benchmarks: gpu_train_bench --no-pdl). Results are the same bits either way.
  bool pdl = true;
  // With pdl: the FlashAttention launcher's kernels too; false launches them plain (A/B
  // benchmarks: gpu_train_bench --no-flash-pdl). The same bits either way.
  bool flashPdl = true;
  // Queue the backward's branches off its chain (codegen::secondStreamNodes: weight-gradient
  // products with enough of the chain's work after them, and what merely moves or sums their
  // results into the gradients) on a second stream of the least priority, beside the chain,
  // joined back at the end of run(). Their inputs stay in the arena until then. Off: one stream
  // (A/B benchmarks: gpu_train_bench --one-stream). Results are the same bits either way.
  bool sideStream = true;
  // With sideStream: a product goes to the second stream only up to this many FLOPs (0: any);
  // larger ones stay on the step's stream, the sums after them go on the second (A/B benchmarks:
  // gpu_train_bench --side-max-gflop).
  double sideStreamMaxFlops = codegen::kSecondStreamMaxFlops;
  // Stop before compiling: the runner is usable once CudaGraphRunner::compileTogether has
  // compiled it with the runners it shares kernels with (CudaSession: the training and the
  // validation runner in one pool of threads).
  bool deferCompile = false;
  // The session's Adam in a fused-mlp-train node's kernel (codegen::EmitOptions::adamInTrainNode):
  // run() then also steps the parameters, reading the state given to bindAdam first.
  bool adamInTrainNode = false;
  // fp32 GEMMs on the FP64 tensor cores where the device runs FP64 at full rate
  // (codegen::EmitOptions::fp32Gemm Auto); false: the SIMT kernel (A/B benchmarks).
  bool fp64Gemm = true;
  // Where wgmma products run their epilogue (codegen::EmitOptions::wgmmaEpilogue; A/B benchmarks).
  codegen::WgmmaEpilogue wgmmaEpilogue = codegen::WgmmaEpilogue::Auto;
  // wgmma products store C by TMA where its rows allow (codegen::EmitOptions::wgmmaTmaStores; A/B
  // benchmarks).
  bool wgmmaTmaStores = true;
};

class CudaGraphRunner {
public:
  // Plans memory (one device arena for activations from the liveness plan; one block for all
  // parameters), compiles every node's kernels with NVRTC for the device's architecture (the
  // kernels are split into a few programs compiled in parallel threads), and uploads constants.
  // Nothing is allocated after this. Throws codegen::NvrtcError, cuda::CudaError or
  // FlashAttentionError.
  CudaGraphRunner(const Graph& g, const cuda::Device& device, const CudaRunnerOptions& opt = {});
  // The code generation choices a runner with options `opt` makes for `device` (also what
  // --dump-kernels writes): TF32, Adam in a fused-mlp-train node, the fp32 GEMM engine, and what
  // the device runs (wgmma, full-rate FP64, its SMs).
  static codegen::EmitOptions emitOptionsFor(const cuda::Device& device, const CudaRunnerOptions& opt);
  // Compiles the kernels of runners made with CudaRunnerOptions::deferCompile, each distinct
  // kernel once over all of them, in one pool of threads, and finishes them (arguments, GEMM
  // choices, constants). The runners after the first share the first one's parameters.
  static void compileTogether(const std::vector<CudaGraphRunner*>& runners);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // numel(shape) floats to or from value `v`, converted where it is stored in bf16 (rounded to
  // nearest on the way up): inputs and parameters, and any value still alive after run().
  void upload(ValueId v, const float* host);
  // A gradient left in its packed gradient (packedGradViews) downloads from there.
  void download(ValueId v, float* host) const;
  // Queues every node's kernels on `stream`, in topological order, with no host synchronisation
  // and no allocation, so a stream capture of it replays as one CUDA graph. Our kernels go out
  // in launchMode(); cuBLASLt's are its own launches. With CudaRunnerOptions::sideStream the
  // gradient leaves go out on the runner's second stream, which waits for `stream` where
  // they follow other nodes, and `stream` waits for it at the end (joinsStreams()).
  void run(cuda::CUstream stream = nullptr);  // (std::logic_error before compileTogether)
  // Whether run() ends with `stream` waiting on the second stream: the next kernel on `stream`
  // should then be launched plain (a programmatic edge is only for a kernel right behind one).
  bool joinsStreams() const { return sideNodes_ > 0; }
  // Nodes run() queues on the second stream, and the places where it waits for the step's
  // stream (one a run of second-stream nodes that no step's-stream launch divides).
  int sideNodes() const { return sideNodes_; }
  int sideForks() const { return static_cast<int>(std::count(forkBefore_.begin(), forkBefore_.end(), 1)); }
  // How run() launches our kernels: Programmatic where CudaRunnerOptions::pdl asked for it and
  // the device and driver allow it, else Plain.
  cuda::LaunchMode launchMode() const { return launch_; }
  // Runs the graph `reps` times with an event pair around every node and returns each node's
  // median time, slowest first (a profile for PA_PROFILE and the benchmarks; it waits). Every
  // kernel is launched plain here, so that no node starts before the event in front of it.
  struct NodeTime {
    NodeId node;
    std::string label;  // "k12_fused_linear  fused-linear [8192,1024]"
    double ms;
  };
  std::vector<NodeTime> profile(cuda::CUstream stream, int reps = 5);
  cuda::CUdeviceptr devicePtr(ValueId v) const { return ptr(v); }
  // The parameter block: every parameter at an offset aligned to 64 floats.
  cuda::CUdeviceptr paramBlock() const { return params_.ptr(); }
  int64_t paramOffset(ValueId p) const;  // in floats, or -1 when `p` lives in another runner
  int64_t paramBlockFloats() const { return paramFloats_; }
  // The bf16 mirror of owned parameter `p` (CudaRunnerOptions::mirrorParamCasts), or 0.
  cuda::CUdeviceptr paramMirror(ValueId p) const;
  // The output of the Cast of CudaRunnerOptions::gatheredInput that the caller writes, or kNoValue.
  ValueId gatheredCast() const { return gatheredCast_; }
  // Where owned parameter `p`'s values go in a packed mirror (mirrorPackedWeights): value i at
  // base[(i / cols) * rowStride + (i % cols) * step], elements of `bytes` (2: bf16, 4: fp32).
  // step 0: none (then paramMirror may be set).
  struct PackedPlace {
    cuda::CUdeviceptr base = 0;
    int64_t cols = 0, rowStride = 0, step = 0, bytes = 4;
  };
  PackedPlace packedMirror(ValueId p) const;
  // Where gradient value `grad`'s values are when the runner leaves it uncomputed
  // (packedGradViews; else step 0): value j at base[(j / cols) * rowStride + (j % cols) * step],
  // fp32.
  PackedPlace packedGrad(ValueId grad) const;
  // Whether a kernel applies the session's Adam (CudaRunnerOptions::adamInTrainNode and a
  // fused-mlp-train node), and the state it reads, which must be given before run().
  bool takesAdam() const { return adamBinding_.bytes() > 0; }
  void bindAdam(const codegen::AdamBinding& b);
  size_t arenaBytes() const { return arenaBytes_; }
  // Kernel launches per run(): generated kernels plus the FlashAttention launcher's.
  int launchesPerRun() const { return launchesPerRun_; }
  int generatedKernels() const { return kernelCount_; }
  // Generated kernels compiled by this runner: one per distinct source (less the names), less
  // those the runner it shares parameters with had compiled already.
  int compiledKernels() const { return compiledCount_; }
  // NVRTC programs and the wall time of the compile phase: a compileTogether's count on its
  // first runner, 0 on the others.
  int programs() const { return programs_; }
  double compileSeconds() const { return compileSeconds_; }
  // What the GEMM provider choice did: nodes on each provider, choices measured now and taken
  // from the autotune cache, and the time spent measuring.
  struct GemmStats {
    int generated = 0, library = 0, measured = 0, cached = 0;
    // Tile variants: nodes whose generated tiles were measured now, taken from the cache, and
    // where a variant other than the emitter's pick won.
    int tilesMeasured = 0, tilesCached = 0, tilesChanged = 0;
    int timedBeside = 0;  // nodes whose cuBLASLt candidates were timed while the kernels compiled
    double tuneSeconds = 0;
  };
  const GemmStats& gemmStats() const { return gemmStats_; }
  // One line per GEMM node the choice measured: generated and best cuBLASLt time (-1: not a
  // candidate), and which ran. Choices from the cache have no times.
  struct GemmChoice {
    NodeId node;
    std::string label;  // "k12 fused-linear 8192x1024x1024 NN bias relu"
    double generatedMs = -1, libraryMs = -1;
    double pickMs = -1;  // the emitter's tiles (-1: not measured, or taken from the cache)
    bool library = false, cached = false;
    bool transposedB = false;  // cuBLASLt on a copy of B without its transpose
  };
  const std::vector<GemmChoice>& gemmChoices() const { return gemmChoices_; }
  // The provider that runs node `id` ("cublaslt" or "generated"; "" for other nodes).
  std::string gemmProviderOf(NodeId id) const;

private:
  struct Launch;
  struct LibraryNode;
  void runNode(NodeId id, cuda::CUstream stream, cuda::LaunchMode mode);
  void runPackedFlash(NodeId id, cuda::CUstream stream, cuda::LaunchMode mode);  // flash-attention-qkv(-grad)
  struct LibraryTiming;
  // Compiles what the runners' launches (and cuBLASLt's transposes and epilogues, withLibrary)
  // need that is not compiled yet.
  static void compileKernels(const std::vector<CudaGraphRunner*>& runners, bool withLibrary);
  void resolveArguments();
  void finish();  // after compileKernels: arguments, GEMM tiles and providers, constants
  void planLibraryGemms(const CudaRunnerOptions& opt);
  void chooseGemmProviders(const CudaRunnerOptions& opt);
  void chooseGemmTiles();
  size_t addTileVariants(NodeId id, const codegen::NodeKernels& chosen, const codegen::EmitOptions& emit);
  std::string tileKey(NodeId id) const;  // the autotune key of a node's tile choice
  int cachedTiles(NodeId id) const;
  // The autotune key of a node's provider choice, with `generated` as its generated kernels.
  std::string providerKey(NodeId id, const std::vector<Launch>& generated) const;
  double timeGenerated(cuda::Stream& stream, const std::vector<Launch>& launches);
  // cuBLASLt's fastest candidate for a node, timed as the whole node (with our kernels around
  // the product): of every candidate, or only of the one timeLibraryProducts found fastest (and
  // of those for a copied transposed B, which it leaves).
  LibraryTiming timeLibrary(NodeId id, cuda::Stream& stream);
  // Beside the compile (it needs no kernel of ours): every cuBLASLt candidate's product alone,
  // for the nodes whose provider choice is neither cached nor in `timed`; the fastest in
  // productBest_, the keys added to `timed`.
  void timeLibraryProducts(std::set<std::string>& timed);
  // The autotuner's tools: fresh random values in the arena and the parameters (once), and the
  // median time of `enqueue` replayed from a CUDA graph.
  void fillForTuning(cuda::Stream& stream);
  double measure(cuda::Stream& stream, const std::function<void(cuda::CUstream)>& enqueue);
  void runLibrary(NodeId id, const LibraryNode& l, cuda::CUstream stream, cuda::LaunchMode mode);
  // cuBLASLt's product alone, with `algo` on the plan (transposed: the one for a copied B).
  void runProduct(NodeId id, const LibraryNode& l, bool transposed, const cuda::LtAlgo& algo, cuda::CUstream stream) const;
  // Every kernel the node may launch: its generated ones, then cuBLASLt's transpose and epilogue
  // kernels (compiled and given arguments alike, whichever provider runs).
  std::vector<Launch*> nodeLaunches(NodeId id, bool withLibrary = true);
  cuda::CUdeviceptr ptr(ValueId v) const;
  void planParamMirrors(const CudaRunnerOptions& opt);
  void refreshMirror(ValueId param);  // runs the casts (and packing nodes) that write the mirror of `param`, waits
  const Graph& g_;
  const cuda::Device& device_;
  std::vector<NodeId> order_;
  cuda::DeviceBuffer arena_, params_;
  std::vector<int64_t> offset_;                        // arena offset (floats) per value, -1 if none
  std::vector<ValueId> root_;                          // per value: whose bytes it uses (MemoryPlan::root)
  std::map<ValueId, int64_t> paramOffset_;             // offset in params_ (floats)
  std::map<ValueId, cuda::CUdeviceptr> sharedParam_;   // parameters of the runner shared with
  std::map<NodeId, cuda::DeviceBuffer> scratch_;       // flash backward workspaces
  cuda::DeviceBuffer mirrors_;                         // bf16 mirrors of the parameters
  cuda::DeviceBuffer adamBinding_;                     // codegen::AdamBinding, where takesAdam()
  bool adamBound_ = false;
  std::map<ValueId, cuda::CUdeviceptr> mirrorPtr_;      // a mirrored cast's output: where its bytes are
  std::map<ValueId, cuda::CUdeviceptr> paramMirror_;    // an owned parameter: its mirror
  std::map<ValueId, std::vector<NodeId>> mirrorCasts_;  // an owned parameter: the casts (and packing nodes) that write its mirror
  std::map<ValueId, PackedPlace> packedPlace_;          // an owned parameter: its place in a packed mirror
  std::map<std::string, cuda::CUdeviceptr> packedByKey_;  // a packed mirror by its node's packedKey()
  std::string packedKey(const Node& n) const;
  enum : char { kRuns = 0, kWritesMirror = 1, kReadsOtherMirror = 2, kGradView = 3, kCastByCaller = 4 };
  ValueId gatheredCast_ = kNoValue;
  void planGatheredCast(const CudaRunnerOptions& opt);
  // packedGradViews: a gradient left in its packed gradient, by the node that would have unpacked it.
  struct GradView {
    NodeId node;
    ValueId packed;
    int64_t first, cols, rowStride, step;  // in elements of the packed gradient
  };
  std::map<ValueId, GradView> gradViews_;
  std::vector<ValueId> planGradViews(const CudaRunnerOptions& opt);
  std::vector<char> skipped_;                          // per node: kRuns, or a node run() skips (a mirrored cast or packing node, a gradient view, the caller's cast)
  std::vector<std::vector<Launch>> launches_;          // per node id
  std::map<NodeId, std::vector<std::vector<Launch>>> tileVariants_;  // other tiles of a generated GEMM
  std::map<NodeId, double> generatedMs_;                   // measured: the node's launches_ now
  std::map<NodeId, double> pickMs_;                        // measured: the emitter's tiles
  std::map<NodeId, LibraryTiming> productBest_;            // timeLibraryProducts: the plan's fastest
  bool tuningFilled_ = false;
  std::map<NodeId, LibraryNode> library_;             // GEMM nodes cuBLASLt can run
  cuda::DeviceBuffer ltWorkspace_;                    // shared by them on the main stream, one at a time
  cuda::DeviceBuffer ltSideWorkspace_;                // the same for those on the second stream
  // CudaRunnerOptions::sideStream: per node id, whether run() queues it on the second stream.
  std::vector<char> side_;
  std::vector<char> launchesAny_;  // per node id: whether runNode() queues anything for it
  std::vector<char> forkBefore_;   // per node id: run() makes the second stream wait for `stream` before it
  int sideNodes_ = 0;
  std::unique_ptr<cuda::Stream> sideStream_;
  std::unique_ptr<cuda::Event> fork_, join_;  // the second stream waits on fork_, run()'s stream on join_
  // Every compiled kernel by its source less its name, with the dynamic shared memory it was
  // opted into, and the modules that hold them (unloaded with the last runner that shares it);
  // shared with the runner this one shares parameters with.
  struct CompiledKernels;
  std::shared_ptr<CompiledKernels> compiled_;
  std::unique_ptr<FlashAttention> flash_;
  bool deterministic_ = false;                        // CudaRunnerOptions::deterministic
  bool tf32_ = false;                                 // CudaRunnerOptions::tf32
  cuda::LaunchMode launch_ = cuda::LaunchMode::Plain;  // from CudaRunnerOptions::pdl and the device
  // The launch mode for the FlashAttention launcher's kernels (CudaRunnerOptions::flashPdl).
  cuda::LaunchMode flashMode(cuda::LaunchMode mode) const { return opt_.flashPdl ? mode : cuda::LaunchMode::Plain; }
  FlashAttentionConfig flashConfig(const Node& n) const;  // the node's problem, with deterministic_ and tf32_
  size_t arenaBytes_ = 0;
  int64_t paramFloats_ = 0;
  CudaRunnerOptions opt_;
  std::vector<std::pair<FlashAttentionConfig, bool>> flashProblems_;  // {config, backward} of every attention node
  bool ready_ = false;  // compiled and finished
  int kernelCount_ = 0, compiledCount_ = 0, launchesPerRun_ = 0, baseLaunches_ = 0, programs_ = 0;
  double compileSeconds_ = 0;
  GemmStats gemmStats_;
  std::vector<GemmChoice> gemmChoices_;
};

// A module compiled from source through the kernel cache, for kernels outside the graph.
class CudaModule {
public:
  CudaModule(const std::string& source, const cuda::Device& device);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;
  cuda::CUfunction function(const char* name) const;
  // Blocks of 256 threads for `work` items, grid-stride beyond 65535·8 blocks.
  static cuda::LaunchShape shapeFor(int64_t work);
  // Launches `fn` over `work` items with shapeFor's blocks; `args` point at the arguments.
  // Programmatic `mode` only for a kernel that begins with pa::pdlBegin() (runtime/cuda/launch.h).
  static void launch(cuda::CUfunction fn, int64_t work, void** args, cuda::CUstream stream = nullptr,
                     cuda::LaunchMode mode = cuda::LaunchMode::Plain);

private:
  cuda::CUmodule module_ = nullptr;
};

}  // namespace pa
