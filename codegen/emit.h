// CUDA source for every node of a final graph: one or more kernels per node, each a complete
// translation unit that NVRTC (or nvcc, once its headers are inlined) compiles on its own.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/tensor_map_spec.h"
#include "graph/graph.h"
#include "codegen/flash_spec.h"

namespace pa::codegen {

// A kernel argument: a node input's or output's device address, the node's scratch, a TMA
// tensor map (kernels/gemm_wgmma.cuh) over an input or over the scratch at `scratchOffsetBytes`,
// which the launcher encodes from that address (runtime/kernel_params.h), or the address of the
// session's Adam binding (AdamBinding, codegen/training_kernels.h).
struct KernelArg {
  // InputTensorMap: the kernel takes a TensorMap (by value) over input `index` instead of a
  // pointer; ScratchTensorMap: over the scratch (`index` names the GEMM operand it holds, or is
  // -1: a split product's partial sums, which the kernel stores through it); OutputTensorMap: over
  // output `index`, which the kernel stores through it (besides its pointer argument).
  // AdamBinding: `const pa::adam::Binding* adam` (EmitOptions::adamInTrainNode).
  enum Kind { Input, Output, Scratch, InputTensorMap, ScratchTensorMap, OutputTensorMap, AdamBinding } kind;
  int index;
  TensorMapSpec map{};
  uint64_t scratchOffsetBytes = 0;
};

struct Kernel {
  std::string name;    // extern "C" symbol: k<node id>_<op>[_<part>], deterministic
  // Starts with a comment naming the graph node and the launch; the kernel's first statement is
  // pa::pdlBegin() (kernels/pdl.cuh, which every kernel includes).
  std::string source;
  std::array<unsigned, 3> grid{1, 1, 1}, block{1, 1, 1};
  unsigned sharedBytes = 0;
  std::vector<KernelArg> args;  // arguments, in order
  std::vector<std::string> headers;  // embedded headers it #includes (by include name), kernels/pdl.cuh aside
};

// The kernel's source without its banner (the leading comment lines, which name its graph node
// and launch) and with its name replaced by one byte that no identifier holds wherever it is an
// identifier or begins one with '_' (the kernel and the helpers named after it, such as
// k2_matmul_problem): kernels equal under this compile to the same code, as a source defines
// nothing mutable outside its kernel (the runner compiles each such source once; a
// transformer's layers repeat the same kernels).
std::string sourceWithoutName(const Kernel& k);

// The name the runner compiles a kernel under, from `key` = sourceWithoutName(k): "pa_", the op
// part of its name (k12_matmul_split: matmul_split) and 16 hex digits of a hash of the key. Kernels
// equal under sourceWithoutName get one name and, through sourceNamed, one program text, however
// their graph numbered its nodes: a program compiled for one graph comes from the kernel cache
// for another (a layer added or removed, another config of the same shapes). Profilers show this
// name.
std::string compiledName(const Kernel& k, const std::string& key);
// `key` (a kernel's sourceWithoutName) with `name` wherever the kernel's name stood.
std::string sourceNamed(const std::string& key, const std::string& name);

// Whether NVRTC takes long over `k`: a kernel built on a GEMM main loop (kernels/gemm_simt.cuh,
// gemm_tf32.cuh, gemm_wgmma.cuh) or the fused MLP takes NVRTC some 20 times as long as a
// pointwise, norm or reduction kernel (bench/RESULTS.md, "one compile pool for the session"). The runner compiles each
// such kernel as a program of its own, first, and packs the others together.
bool compilesSlowly(const Kernel& k);

// How the runner splits kernels into NVRTC programs (indices into `kernels`, in their order):
// each kernel that compilesSlowly alone, those first, then the others up to eight to a program in
// their order. NVRTC's time on a program grows faster than the program (bench/RESULTS.md, "one
// compile pool for the session"). The kernels of one program must be distinct under
// sourceWithoutName: the runner compiles each under its compiledName.
std::vector<std::vector<size_t>> splitIntoPrograms(const std::vector<const Kernel*>& kernels);

// Whether `source` defines at least one kernel and every kernel in it (each __global__ function)
// begins with pa::pdlBegin(), the prologue of kernels/pdl.cuh: the condition for launching it as a
// programmatic dependent (runtime/cuda/launch.h). Generated, FlashAttention and training kernels
// all do; the tests check each family with this.
bool beginsWithPdlPrologue(const std::string& source);

struct NodeKernels {
  std::vector<Kernel> kernels;  // launched in order
  size_t scratchBytes = 0;      // a per-node device scratch buffer, when needed
  // The scratch must hold zeros before the first launch (a counter its kernels reset themselves).
  bool zeroScratch = false;
  // Nodes the FlashAttention launcher runs (runtime/flash_attention.h) have `external` set; their
  // kernels are the launcher's instantiations, listed for --dump-kernels and the CI compile.
  bool external = false;
};

// GemmTile, Tf32BLoad and GemmGeometry: codegen/gemm_plan.h.

// Code generation choices. The GEMM emitters (MatMul, FusedLinear) read them, and the flash-
// attention nodes' dumps (wgmma, fullRateFp64).
struct EmitOptions {
  bool tf32 = false;  // GEMMs on the tensor cores with TF32 operands (fp32 accumulation)
  // fp32 GEMMs without tf32: the SIMT kernel or the FP64 tensor cores (Auto: FP64 where
  // fullRateFp64). Tests and benchmarks force either.
  Fp32Gemm fp32Gemm = Fp32Gemm::Auto;
  GemmTile gemmTile = GemmTile::Auto;
  int gemmSplits = 0;  // K splits of a single (unbatched) GEMM; 0: from the shape
  // fp32 GEMMs on large tiles (one unbatched product): K splits of the tiles of the last, partial
  // wave ("tail split" in gemm_plan.cpp); 0: from the shape, 1: none.
  int gemmTailSplits = 0;
  // A TF32 wgmma GEMM whose B is stored N-major (the kernel reads it K-major): copied transposed
  // into the node's scratch by a kernel of its own, or transposed by the product kernel's
  // producer warpgroup as it loads it; Auto: from the shape (codegen's tf32Plan).
  Tf32BLoad tf32BLoad = Tf32BLoad::Auto;
  // Where a wgmma GEMM's epilogue runs (codegen/gemm_plan.h); Auto in production, the others for
  // tests and gemm_bench's sweep.
  WgmmaEpilogue wgmmaEpilogue = WgmmaEpilogue::Auto;
  // A wgmma GEMM whose epilogue runs on the fragments stores C (or a split product's partial
  // sums) by TMA where C's rows are whole 16-byte chunks (kernels/gemm_wgmma.cuh); false: by its
  // threads everywhere (tests and gemm_bench's A/B rows).
  bool wgmmaTmaStores = true;
  // The target has wgmma (sm_90a): GEMMs whose operands are both bf16 run kernels/gemm_wgmma.cuh
  // (dynamic shared memory above 48 KB: the launcher opts in with Kernel::sharedBytes).
  bool wgmma = false;
  // The target runs FP64 at full rate (FlashTarget::fullRateFp64): fp32 flash-attention forwards
  // there run on the FP64 tensor cores where FlashFp64Mma::kAuto picks them, and fp32 GEMMs do
  // (fp32Gemm Auto).
  bool fullRateFp64 = false;
  // The device's SM count: the wgmma GEMMs are persistent and start at most this many blocks
  // (times the blocks an SM holds).
  int sms = 132;
  // The session's Adam step in a fused-mlp-train kernel: each parameter gradient's final value
  // also updates the parameter and its moments, and the loss goes to the session's ring, through
  // an AdamBinding argument (codegen/training_kernels.h). Only for a step whose parameters are all
  // the node's and that clips no gradient (CudaSession decides; runtime/cuda_session.cpp).
  bool adamInTrainNode = false;
  // Appended to every kernel name ("_v1"): alternative emissions of one node (the runner's GEMM
  // tile candidates) can then share an NVRTC program.
  std::string kernelSuffix;
};

// How a GEMM node (MatMul, FusedLinear, MatMulActGrad, MatMulBiasGrad) maps onto a library GEMM (cuBLASLt):
// the product, the bias (input 2) and ReLU it may apply, and the output it writes (FusedLinear
// with GELU: the pre-activation, out1). `supported` is false for every other node.
struct LibraryGemm {
  bool supported = false;
  GemmGeometry geometry;
  bool bias = false, relu = false;
  int output = 0;
  // MatMulBiasGrad: the node input (0: A, 1: B) whose sums over K are its output 1; -1: none.
  // The library may write them in place of a bias (bias is false then).
  int biasGradOf = -1;
};
LibraryGemm libraryGemmOf(const Graph& g, NodeId id);
// What remains of the node's epilogue once the library has written its product (with the bias,
// or MatMulBiasGrad's bias gradient, and ReLU where `libraryBias`/`libraryRelu`): zero or one
// elementwise kernel, in place, or the bias gradient's column sums.
NodeKernels libraryGemmEpilogue(const Graph& g, NodeId id, bool libraryBias, bool libraryRelu);
// For an unbatched GEMM node with transposed B: one kernel copying B ([N, K]) to the node's
// scratch as [K, N], so that the library can run the product without the transpose (a candidate
// the autotuner times; bench/RESULTS.md, "The GEMM plan's constants").
NodeKernels libraryGemmTransposeB(const Graph& g, NodeId id);

// fp32 kernels for node `id` (Input, Param and Constant need none: constants are uploaded).
NodeKernels emitNode(const Graph& g, NodeId id);
NodeKernels emitNode(const Graph& g, NodeId id, const EmitOptions& opt);

// Whether a flash-attention(-grad) node's q, k, v, o and their gradients are [B, S, H, D]
// (attribute layout: "bshd", read and written with strides) instead of [B, H, S, D].
bool flashLayoutBshd(const Node& n);
// flash-attention-qkv(-grad): Q, K and V are heads of one packed [B, S, Hq + 2 Hk, D] operand.
bool flashPackedQkv(const Node& n);
// The launcher's problem description of a flash-attention or flash-attention-grad node (fp32, or
// bf16 where lower-bf16 stored q in bf16). `tf32` (precision: tf32) puts fp32 attention on the
// TF32 tensor cores.
FlashAttentionConfig flashConfigOf(const Graph& g, const Node& n, bool tf32 = false);

// The source with every embedded header it includes pasted in, for nvcc and --dump-kernels.
std::string selfContainedSource(const Kernel& k);

// Writes every kernel of every live node of `g` as DIR/<name>.cu; returns how many. Without
// options: the kernels of a device without TF32 or wgmma choices (any sm_80+ GPU).
int dumpKernels(const Graph& g, const std::string& dir);
int dumpKernels(const Graph& g, const std::string& dir, const EmitOptions& opt);

}  // namespace pa::codegen
