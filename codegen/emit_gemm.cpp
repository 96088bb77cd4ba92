// Emitters of the GEMM nodes (MatMul, FusedLinear, MatMulActGrad, MatMulBiasGrad): the generated GEMM kernels
// with their epilogues, TMA maps and operand copies, and the mapping of a node onto a library GEMM
// (cuBLASLt) with what remains of its epilogue. The choice of kernel, tiles and splits is
// codegen/gemm_plan.h's.
#include <algorithm>
#include <cassert>
#include <cmath>

#include "codegen/emit_internal.h"
#include "codegen/gemm_plan.h"
#include "codegen/templates/gemm.h"
#include "graph/node_attrs.h"

namespace pa::codegen {

namespace detail {

using namespace templates;

namespace {

// The TMA map of a wgmma GEMM operand (kernels/gemm_wgmma.cuh's note): matrices of `contiguous`
// × `other` elements of `bytes` each (2: bf16, 4: fp32), `batch` of them `stride` elements apart
// (0: one shared matrix), boxes of 128 bytes along the contiguous extent and `boxOther` along the
// other.
TensorMapSpec gemmTensorMap(int64_t contiguous, int64_t other, int64_t batch, int64_t stride, int64_t boxOther, int bytes = 2) {
  TensorMapSpec t;
  t.elementBytes = static_cast<uint32_t>(bytes);
  t.dims[0] = static_cast<uint64_t>(contiguous);
  t.dims[1] = static_cast<uint64_t>(other);
  t.dims[2] = static_cast<uint64_t>(stride != 0 ? batch : 1);
  t.strideBytes[0] = static_cast<uint64_t>(contiguous * bytes);
  t.strideBytes[1] = static_cast<uint64_t>((stride != 0 ? stride : contiguous * other) * bytes);
  t.box[0] = static_cast<uint32_t>(128 / bytes);
  t.box[1] = static_cast<uint32_t>(boxOther);
  t.box[2] = 1;
  return t;
}

// Note on the GEMM kernels. The algorithms live in kernels/gemm_simt.cuh (fp32 SIMT with blocked
// summation), kernels/gemm_tf32.cuh (TF32 or FP64 mma.sync) and kernels/gemm_wgmma.cuh (bf16 or TF32
// wgmma, sm_90a); a generated kernel only names its problem (shape, transposes, batch strides, K
// splits: compile-time constants), its epilogue (bias, activation, FusedLinear's saved
// pre-activation) and one tile variant (codegen/gemm_plan.h). Variants, from the shape:
//   large   128×128 tiles: the efficient one, but only ⌈M/128⌉·⌈N/128⌉ blocks;
//   split   large tiles with K split S ways when that leaves the GPU idle and K is long (the
//           weight gradients Xᵀ·dY of a batch-8192 layer: 64 blocks on 132 SMs for 1024×1024):
//           S·M·N partial sums in the node's scratch buffer, then a reduce kernel adds them in a
//           fixed order (deterministic) and applies the epilogue;
//   tail    large tiles whose last, partial wave is split along K (fp32 SIMT; see "tail split");
//   medium  64×64 tiles: 4× the blocks, for batched products too small for large tiles;
//   small   32×32 tiles of 64 threads: tiny models (a 3×5 output gets one 64-thread block).
// The epilogue (GemmEpilogue): `moreThanC`: it reads or writes more than C (an input laid out as
// C, a side output), which the wgmma kernel then runs on its staged raw sums
// (EmitOptions::wgmmaEpilogue Auto); `auxBody`, when not empty, is such an epilogue's whole
// formula from v and s = aux[i] (kAux).
// `pairBody`, when not empty, makes the epilogue a pair epilogue (kernels/gemm_common.cuh): it
// runs after each column pair's v0 and v1 went through `epilogue`; `cOutput` is the output the
// product writes. `sumInput` (0: A, 1: B; -1: none) asks for that operand's sums over K in the
// node's output 1 (MatMulBiasGrad): the mma.sync kernels (TF32, FP64) and the bf16 wgmma kernel
// (an MN-major operand) of one product add them as the operand's tiles pass through shared memory
// ("Operand sums" in kernels/gemm_common.cuh), a split product's reduce kernel adding the splits'
// partial sums; `*summed` says whether this emission wrote them (elsewhere the caller adds
// column-sum kernels).
struct GemmEpilogue {
  std::string body, members, init;  // the functor's statements on v (at m, n, i), its members, their setting
  int cOutput = 0;
  std::string pairBody;
  bool moreThanC = false;
  std::string auxBody;
};

NodeKernels gemm(const Ctx& c, const GemmGeometry& q, const GemmEpilogue& e = {}, int sumInput = -1, bool* summed = nullptr) {
  const int64_t m = q.m, n = q.n, k = q.k;
  // bf16 operands on an sm_90a device go to the wgmma kernel when their contiguous extents and
  // batch strides allow 16-byte copies. Elsewhere they are widened into the scratch buffer first
  // and multiplied on the TF32 path (exact: TF32 holds every bf16 value).
  const bool wide[2] = {c.inType(0) == DType::BF16, c.inType(1) == DType::BF16};
  const bool wgmmaBf16 = c.opt->wgmma && wide[0] && wide[1] && (q.transA ? m : k) % 8 == 0 &&
                         (q.transB ? k : n) % 8 == 0 && q.strideA % 8 == 0 && q.strideB % 8 == 0;
  // fp32 operands with precision tf32 on an sm_90a device: the same kernel on TF32, which reads B
  // K-major and A K-major or, from registers, M-major: tf32Plan says which operand is first
  // copied transposed into the scratch (K a multiple of 4: 16-byte rows for TMA).
  // A pair epilogue needs C's own rows (no swapped product).
  const bool wgmmaTf32 = c.opt->wgmma && c.opt->tf32 && !wide[0] && !wide[1] && k % 4 == 0 && (k + 31) / 32 <= 65535 &&
                         q.batch <= 65535 &&  // (the transpose kernels' grid)
                         (c.opt->gemmTile != GemmTile::Auto || c.opt->tf32BLoad != Tf32BLoad::Auto ||  // forced: wherever it can
                          tf32WgmmaPays(q, c.opt->tf32BLoad)) &&
                         (e.pairBody.empty() || !tf32Plan(q, c.opt->tf32BLoad).swap);
  const bool wgmma = wgmmaBf16 || wgmmaTf32;
  const bool tf32 = !wgmma && (c.opt->tf32 || wide[0] || wide[1]);
  // fp32 operands under precision fp32: the FP64 tensor cores where the target runs them at full
  // rate (exact products, fp64 sums), the SIMT kernel elsewhere.
  const bool f64 = !wgmma && !tf32 &&
                   (c.opt->fp32Gemm == Fp32Gemm::F64Mma || (c.opt->fp32Gemm == Fp32Gemm::Auto && c.opt->fullRateFp64));
  // The product the kernel computes: TF32 wgmma's from tf32Plan, the node's elsewhere.
  const Tf32Plan plan = wgmmaTf32 ? tf32Plan(q, c.opt->tf32BLoad) : Tf32Plan{q};
  const GemmGeometry& pq = plan.product;
  std::pair<GemmTile, int> choice = wgmma ? chooseWgmma(q.batch, pq.m, pq.n, k)
                                    : f64   ? chooseF64Gemm(q.batch, m, n, k)
                                            : chooseGemm(tf32, q.batch, m, n, k);
  if (c.opt->gemmTile != GemmTile::Auto) choice = {c.opt->gemmTile, 1};
  if (c.opt->gemmSplits > 0 && q.batch == 1) choice.second = c.opt->gemmSplits;
  // Ping-pong consumers are the bf16 wgmma kernel's; elsewhere the same 128 × 128 tile shared by
  // two consumers.
  if (choice.first == GemmTile::PingPong && !wgmmaBf16) choice.first = GemmTile::Medium;
  const GemmVariant v = wgmma ? wgmmaVariant(choice.first, wgmmaTf32) : f64 ? f64Variant(choice.first) : gemmVariant(tf32, choice.first);
  // The product kernel's header; a tail split's reduce is the SIMT one's, split-K's is shared.
  const std::string header = wgmma ? "kernels/gemm_wgmma.cuh" : tf32 || f64 ? "kernels/gemm_tf32.cuh" : "kernels/gemm_simt.cuh";
  const std::string tailReduceHeader = "kernels/gemm_simt.cuh", splitReduceHeader = "kernels/gemm_common.cuh";
  const int splits = choice.second;
  const bool stageRaw = c.opt->wgmmaEpilogue == WgmmaEpilogue::Staged || (c.opt->wgmmaEpilogue == WgmmaEpilogue::Auto && e.moreThanC);
  const int64_t tiles = tilesOf(pq.m, pq.n, v.bm, v.bn);
  const TailSplit tail = !wgmma && !tf32 && !f64 && choice.first == GemmTile::Large && splits == 1 && q.batch == 1
                             ? chooseTailSplit(tiles, k, v.bm, v.bn, int64_t{c.opt->sms} * v.minBlocks, c.opt->gemmTailSplits)
                             : TailSplit{};
  // Operand sums inside the product (see above), one product: the mma.sync kernels; the bf16
  // wgmma kernel where the summed operand is MN-major (A transposed, B not: a weight gradient's dY)
  // and the sums fp32 (as lower-bf16 leaves gradients).
  const bool sums = sumInput >= 0 && q.batch == 1 &&
                    (tf32 || f64 || (wgmmaBf16 && (sumInput == 0 ? q.transA : !q.transB) && c.outType(1) == DType::F32));
  if (summed) *summed = sums;
  const int64_t sumExtent = sumInput == 0 ? m : n;
  const std::string sumType = "pa::gemm::OperandSums<" + std::to_string(sumInput + 1) + ", ";
  TemplateVars vars = {{"TAILTILES", ll(tail.tiles)}, {"TAILSPLITS", std::to_string(tail.splits)},
                       {"M", ll(pq.m)}, {"N", ll(pq.n)}, {"K", ll(k)}, {"ABATCH", ll(pq.strideA)}, {"BBATCH", ll(pq.strideB)},
                       {"TA", pq.transA ? "true" : "false"}, {"TB", pq.transB ? "true" : "false"},
                       {"TC", plan.swap ? "true" : "false"},
                       {"SPLITS", std::to_string(splits)}, {"BATCH", ll(q.batch)}, {"EPIMEMBERS", e.members},
                       {"PAIRS", e.pairBody.empty() ? "false" : "true"},
                       {"STAGERAW", stageRaw ? "true" : "false"},
                       {"AUX", e.auxBody.empty() ? "false" : "true"},
                       {"AUXFN", e.auxBody.empty() ? std::string()
                                                   : "  __device__ __forceinline__ float withAux(float v, float s) const {\n" + e.auxBody +
                                                         "    return v;\n  }\n"},
                       {"PAIRBODY", e.pairBody},
                       {"EPILOGUE", "    (void)m, (void)n, (void)i;\n" + e.body}};
  const std::string cOut = "out" + std::to_string(e.cOutput);
  NodeKernels nk;
  // Scratch, in floats: [widened or transposed A][widened or transposed B][split partial sums].
  // The product reads each operand from the node, or its copy.
  int64_t scratchFloats = 0;
  std::string operand[2] = {wgmma ? "map0" : "in0", wgmma ? "map1" : "in1"};
  std::vector<KernelArg> operandArgs;
  if (wgmmaTf32) {
    // Kernel operand i (node input plan.input[i]): K-major rows, `other` rows of K (the product's
    // M for A, N for B) per batch entry; or A M-major (K rows of M, boxes of 32 × 32, read into
    // registers); or a K-major copy.
    for (int i = 0; i < 2; ++i) {
      const int input = plan.input[i];
      operand[i] = "map" + std::to_string(input);  // (a map's parameter is named after the input it holds)
      const int64_t other = i == 0 ? pq.m : pq.n, stride = i == 0 ? pq.strideA : pq.strideB, box = i == 0 ? v.bm : v.bn;
      if (i == 0 && pq.transA) {
        operandArgs.push_back({KernelArg::InputTensorMap, input, gemmTensorMap(other, k, q.batch, stride, 32, 4)});
        continue;
      }
      if (i == 1 && plan.transposeB) {  // the pointer, whose type picks the transposing producer
        operand[i] = "static_cast<const float*>(in" + std::to_string(input) + ")";
        operandArgs.push_back({KernelArg::Input, input});
        continue;
      }
      const TensorMapSpec map = gemmTensorMap(k, other, q.batch, stride, box, 4);
      if (!plan.copy[i]) {
        operandArgs.push_back({KernelArg::InputTensorMap, input, map});
        continue;
      }
      const int64_t copies = stride != 0 ? q.batch : 1;  // stored [copies][K][other]
      nk.kernels.push_back(finish(c, std::string("transpose_") + (input == 0 ? "a" : "b"), kGemmTranspose,
                                  {{"R", ll(k)}, {"C", ll(other)}, {"OFFSET", ll(scratchFloats)}, {"INPUT", std::to_string(input)}},
                                  {static_cast<unsigned>((other + 31) / 32), static_cast<unsigned>((k + 31) / 32),
                                   static_cast<unsigned>(copies)},
                                  kThreads, {{KernelArg::Input, input}, {KernelArg::Scratch, 0}}));
      operandArgs.push_back({KernelArg::ScratchTensorMap, input, map, static_cast<uint64_t>(scratchFloats) * sizeof(float)});
      scratchFloats += (copies * k * other + 63) / 64 * 64;  // 256-byte aligned, as TMA wants 16
    }
  }
  if (wgmmaBf16) {
    operandArgs.push_back({KernelArg::InputTensorMap, 0,
                           q.transA ? gemmTensorMap(m, k, q.batch, q.strideA, 64) : gemmTensorMap(k, m, q.batch, q.strideA, v.bm)});
    operandArgs.push_back({KernelArg::InputTensorMap, 1,
                           q.transB ? gemmTensorMap(k, n, q.batch, q.strideB, v.bn) : gemmTensorMap(n, k, q.batch, q.strideB, 64)});
  }
  for (int i = 0; i < 2 && !wgmma; ++i) {
    if (!wide[i]) {
      operandArgs.push_back({KernelArg::Input, i});
      continue;
    }
    const int64_t count = numel(c.in(i));
    nk.kernels.push_back(finish(c, std::string("widen_") + (i == 0 ? "a" : "b"), kGemmWiden,
                                {{"COUNT", ll(count)}, {"OFFSET", ll(scratchFloats)}, {"INPUT", std::to_string(i)}},
                                {gridFor(count), 1, 1}, kThreads, {{KernelArg::Input, i}, {KernelArg::Scratch, 0}}));
    operand[i] = "scratch + " + ll(scratchFloats);
    scratchFloats += (count + 63) / 64 * 64;  // 256-byte aligned: the vector loads want 16
  }
  std::vector<KernelArg> epilogueArgs;  // the epilogue's inputs (bias, saved activation) and the outputs
  for (const KernelArg& a : allArgs(c.n))
    if ((a.kind != KernelArg::Input || a.index >= 2) && !(c.n.op == OpKind::MatMulBiasGrad && a.kind == KernelArg::Output && a.index == 1))
      epilogueArgs.push_back(a);  // (a bias gradient is not the product's: its own kernels write it)
  auto join = [](std::vector<KernelArg> a, const std::vector<KernelArg>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<KernelArg> scratchArg{{KernelArg::Scratch, 0}};
  // The wgmma kernel is persistent: its blocks walk the work items (tiles × batch or splits).
  const int64_t items = tiles * (splits > 1 ? splits : q.batch);
  const std::array<unsigned, 3> grid =
      wgmma ? std::array<unsigned, 3>{static_cast<unsigned>(std::max<int64_t>(std::min<int64_t>(items, int64_t{c.opt->sms} * v.minBlocks), 1)), 1, 1}
            : std::array<unsigned, 3>{static_cast<unsigned>(std::max<int64_t>(tiles, 1)), 1, static_cast<unsigned>(splits > 1 ? splits : q.batch)};
  auto problem = [&](const std::string& part, const std::string& reduceHeader = std::string()) {
    TemplateVars pv = vars;
    pv["NAME"] = c.kernelName(part);
    pv["HEADER"] = part == "reduce" ? reduceHeader : header;
    if (part == "reduce") pv["M"] = ll(m), pv["N"] = ll(n), pv["TC"] = "false";  // the partial sums are laid out as C
    return fillTemplate(kGemmProblem, pv);
  };
  // C (or a split product's fp32 partial sums, its kernel's C) by TMA stores where the wgmma
  // kernel's fragments epilogue writes C's own rows and they are whole 16-byte chunks
  // (EmitOptions::wgmmaTmaStores).
  const int cBytes = splits > 1 || c.outType(e.cOutput) != DType::BF16 ? 4 : 2;
  std::vector<KernelArg> cMapArg;
  if (wgmma && c.opt->wgmmaTmaStores && !plan.swap && (splits > 1 || !stageRaw) && pq.n * cBytes % 16 == 0) {
    const int64_t batch = splits > 1 ? splits : q.batch;
    const TensorMapSpec map = gemmTensorMap(pq.n, pq.m, batch, batch > 1 ? pq.m * pq.n : 0, 64, cBytes);
    cMapArg.push_back(splits > 1 ? KernelArg{KernelArg::ScratchTensorMap, -1, map, static_cast<uint64_t>(scratchFloats) * sizeof(float)}
                                 : KernelArg{KernelArg::OutputTensorMap, e.cOutput, map});
  }
  const TemplateVars kernelVars = {{"THREADS", std::to_string(v.threads)}, {"MINBLOCKS", std::to_string(v.minBlocks)},
                                   {"CMAP", cMapArg.empty() ? std::string() : ", " + tensorMapArgName(cMapArg[0])},
                                   {"ALGO", wgmma ? "wgmmaGemm" : tf32 ? "tf32Gemm" : f64 ? "f64Gemm" : "simtGemm"}, {"CONFIG", v.config},
                                   {"APTR", operand[0]}, {"BPTR", operand[1]},
                                   {"SHAREDCHECK", wgmma || tf32 || f64 ? std::string()
                                                                 : "static_assert(pa::gemm::" + v.config + "::kDynamicShared == " +
                                                                       std::to_string(v.sharedBytes) +
                                                                       ", \"the launch's dynamic shared memory is the config's\");\n"},
                                   // (the wgmma kernel's sums come before its map of C)
                                   {"SUMS", sums && splits == 1   ? ", " + sumType + "float>{out1}"
                                            : !cMapArg.empty() ? std::string(", pa::gemm::NoSums()")
                                                               : std::string()}};
  if (tail.splits > 1) {
    TemplateVars kv = kernelVars;
    kv["PROBLEM"] = problem("");
    kv["EPIINIT"] = e.init;
    kv["PARTS"] = ll(scratchFloats);
    kv["COUT"] = cOut;
    kv.erase("ALGO");  // (simtGemmTail)
    kv.erase("SUMS");
    kv.erase("CMAP");
    const int64_t blocks = tiles - tail.tiles + tail.tiles * tail.splits;
    nk.kernels.push_back(finish(c, "", kGemmTail, kv, {static_cast<unsigned>(blocks), 1, 1}, static_cast<unsigned>(v.threads),
                                join(join(operandArgs, epilogueArgs), scratchArg), {header}, v.sharedBytes));
    const int64_t count = tail.tiles * v.bm * v.bn;
    TemplateVars rv = {{"PROBLEM", problem("reduce", tailReduceHeader)}, {"EPIINIT", e.init}, {"PARTS", ll(scratchFloats)}, {"CONFIG", v.config},
                       {"COUT", cOut}};
    nk.kernels.push_back(finish(c, "reduce", kGemmTailReduce, rv, {gridFor(count), 1, 1}, kThreads, join(scratchArg, epilogueArgs),
                                {tailReduceHeader}));
    nk.scratchBytes = static_cast<size_t>(scratchFloats + tail.splits * count) * sizeof(float);
    return nk;
  }
  if (splits == 1) {
    TemplateVars kv = kernelVars;
    kv["PROBLEM"] = problem("");
    kv["EPIINIT"] = e.init;
    kv["COUT"] = cOut;
    std::vector<KernelArg> args = join(join(operandArgs, epilogueArgs), scratchFloats > 0 ? scratchArg : std::vector<KernelArg>{});
    if (sums) args.push_back({KernelArg::Output, 1});
    args = join(args, cMapArg);
    nk.kernels.push_back(finish(c, "", kGemm, kv, grid, static_cast<unsigned>(v.threads), args, {header}, v.sharedBytes));
    nk.scratchBytes = static_cast<size_t>(scratchFloats) * sizeof(float);
    return nk;
  }
  // Scratch after the operands: [splits][M][N] partial products, then (8-byte aligned) the
  // operand sums' [parts][extent] fp64 partials: a split's (mma.sync), or a split's per tile row
  // (B) or column (A) of the product (wgmma; kernels/gemm_wgmma.cuh, "Operand sums").
  const int64_t sumParts = (scratchFloats + splits * m * n + 1) / 2 * 2;
  const int64_t sumPartCount = splits * (wgmma ? (sumInput == 0 ? (n + v.bn - 1) / v.bn : (m + v.bm - 1) / v.bm) : 1);
  const std::string sumPtr = "reinterpret_cast<double*>(scratch + " + ll(sumParts) + ")";
  TemplateVars kv = kernelVars;
  kv["PROBLEM"] = problem("split");
  kv["PARTS"] = ll(scratchFloats);
  if (sums) kv["SUMS"] = ", " + sumType + "double>{" + sumPtr + "}";
  nk.kernels.push_back(finish(c, "split", kGemmSplit, kv, grid, static_cast<unsigned>(v.threads),
                              join(join(operandArgs, scratchArg), cMapArg), {header}, v.sharedBytes));
  // The reduce's elements a thread (kernels/gemm_common.cuh, splitReduce): 4 or 2 where N allows,
  // every split's chunk fits 32 registers and the grid still covers the SMs; else 1.
  int width = 1;
  for (int w : {4, 2})
    if (n % w == 0 && splits * w <= 32 && m * n / (w * kThreads) >= c.opt->sms) {
      width = w;
      break;
    }
  TemplateVars rv = {{"PROBLEM", problem("reduce", splitReduceHeader)}, {"EPIINIT", e.init}, {"PARTS", ll(scratchFloats)}, {"COUT", cOut},
                     {"WIDTH", std::to_string(width)},
                     {"SUMREDUCE", sums ? "  pa::gemm::splitReduceSums<" + c.kernelName("reduce") + "_problem, " +
                                              std::to_string(sumPartCount) + ">(" + sumPtr + ", out1, " + ll(sumExtent) + ");\n"
                                        : ""}};
  std::vector<KernelArg> reduceArgs = join(scratchArg, epilogueArgs);
  if (sums) reduceArgs.push_back({KernelArg::Output, 1});
  nk.kernels.push_back(finish(c, "reduce", kGemmReduce, rv, {gridFor(m * n / width), 1, 1}, kThreads, reduceArgs, {splitReduceHeader}));
  nk.scratchBytes = static_cast<size_t>(sums ? sumParts + 2 * sumPartCount * sumExtent : scratchFloats + splits * m * n) * sizeof(float);
  return nk;
}

// A MatMul-shaped node (transpose_a/transpose_b, batched or shared operands) as one GEMM.
GemmGeometry matmulGeometry(const Ctx& c) {
  const Shape& a = c.in(0);
  const Shape& b = c.in(1);
  GemmGeometry q;
  q.transA = c.n.attrs.get<attr::TransposeA>();
  q.transB = c.n.attrs.get<attr::TransposeB>();
  q.m = q.transA ? a[a.size() - 1] : a[a.size() - 2];
  q.k = q.transA ? a[a.size() - 2] : a[a.size() - 1];
  q.n = q.transB ? b[b.size() - 2] : b[b.size() - 1];
  const int64_t batchA = numel(llvm::ArrayRef<int64_t>(a.data(), a.size() - 2));
  const int64_t batchB = numel(llvm::ArrayRef<int64_t>(b.data(), b.size() - 2));
  if (a.size() > 2 && b.size() == 2 && !q.transA) {  // a batch of row blocks times one shared matrix: one taller GEMM
    q.m *= batchA;
    return q;
  }
  q.batch = std::max(batchA, batchB);
  q.strideA = a.size() > 2 ? q.m * q.k : 0;
  q.strideB = b.size() > 2 ? q.k * q.n : 0;
  return q;
}

// FusedLinear (rope)'s turn of the column pair (n, n + 1), n even, of row m, held in the float
// lvalues v0 and v1: row m of [..., S, N] is position m mod S, the pair is j = (n mod head_dim) / 2
// of its head, and pairs from dims/2 on keep their values. invFreq = base^(-2j/dims) as
// exp2(2j · (-log2(base) / dims)) in double.
std::string ropePairStatement(const Ctx& c, const std::string& v0, const std::string& v1, const std::string& m, const std::string& n) {
  const AttrMap& a = c.n.attrs;
  const Shape& x = c.in(0);
  const int64_t hd = a.get<attr::HeadDim>(), dims = a.get<attr::RopeDims>() ? a.get<attr::RopeDims>() : hd;
  const std::string rate = exactDouble(-std::log2(a.get<attr::RopeBase>()) / static_cast<double>(dims));
  const std::string d = "(" + n + " % " + ll(hd) + ")";
  return "    if (" + d + " < " + ll(dims) + ") {\n  " +
         ropeTurn("(double)(" + m + " % " + ll(x[x.size() - 2]) + ") * exp2((double)" + d + " * " + rate + ")", v0, v1, false) +
         "    }\n";
}

GemmGeometry fusedLinearGeometry(const Ctx& c) {
  const Shape& x = c.in(0);
  const Shape& w = c.in(1);
  GemmGeometry q;
  q.transB = c.n.attrs.get<attr::TransposeW>();
  q.k = x.back();
  q.n = q.transB ? w[0] : w[1];
  q.m = numel(x) / std::max<int64_t>(q.k, 1);
  return q;
}

}  // namespace

// Products with an extent of 1 are memory-bound, and a GEMM tile would use 1/8 or less of an
// 8-wide wgmma or mma.sync: they take kernels of their own (emit_pointwise.cpp). Aᵀ·B with B one
// column (a layer to one output's weight gradient, A [K, M] and B [K, 1]) is the column product,
// with the bias gradient beside where the node has one; K = 1 (that layer's input gradient) the
// outer product; a FusedLinear to one output (activation none or relu) the row dot.
static bool isColumnProduct(const Ctx& c) {
  const GemmGeometry q = matmulGeometry(c);
  return q.transA && !q.transB && q.n == 1 && q.batch == 1 && c.in(0).size() == 2 && c.in(1).size() == 2;
}

NodeKernels emitMatMul(const Ctx& c) {
  if (isColumnProduct(c)) return columnProduct(c, false);
  const GemmGeometry q = matmulGeometry(c);
  if (q.k == 1 && q.batch == 1) return outerProduct(c, q.m, q.n);  // a layer from one output's input gradient
  return gemm(c, q);
}

// The matmul with ReluGrad/GeluGrad's formula as its epilogue (aux: the saved activation input,
// laid out as C).
NodeKernels emitMatMulActGrad(const Ctx& c) {
  GemmEpilogue e;
  e.members = "  " + argType(c.inType(2), false) + " aux;\n", e.init = "  epilogue.aux = in2;\n";
  e.body = "    v = withAux(v, aux[i]);\n";
  e.auxBody = "    v = " + activationGradOf(c.n.attrs.get<attr::GradActivation>(), "v", "s") + ";\n";
  e.moreThanC = true;
  return gemm(c, matmulGeometry(c), e);
}

int biasGradInput(const Node& n) { return n.attrs.get<attr::BiasOperand>() == "a" ? 0 : 1; }

// The product with its bias gradient: a column product sums B beside (columnProduct); the mma.sync
// kernels (TF32, FP64) and the bf16 wgmma kernel (the operand MN-major) sum the operand inside the
// product (gemm's `sumInput`); elsewhere SumTo's kernels over the summed operand follow the product
// (after it, so the two share the node's scratch), as MatMul + SumTo did. cuBLASLt writes both in
// one.
NodeKernels emitMatMulBiasGrad(const Ctx& c) {
  const int input = biasGradInput(c.n);
  bool summed = false;
  if (isColumnProduct(c) && input == 1) return columnProduct(c, true);
  NodeKernels nk = gemm(c, matmulGeometry(c), {}, input, &summed);
  if (summed) return nk;
  NodeKernels sums = columnSums(c, input, 1);
  for (Kernel& k : sums.kernels) nk.kernels.push_back(std::move(k));
  nk.scratchBytes = std::max(nk.scratchBytes, sums.scratchBytes);
  return nk;
}

NodeKernels emitFusedLinear(const Ctx& c) {
  const GemmGeometry q = fusedLinearGeometry(c);
  const std::string act = c.n.attrs.get<attr::Activation>();
  if (q.n == 1 && (act == "none" || act == "relu")) return rowDot(c, q.m, q.k, act == "relu");  // a layer to one output
  // The epilogue functor: bias by column, GELU's input saved to out1 (its gradient reads it).
  GemmEpilogue e;
  if (c.n.inputs.size() == 3) {
    e.members += "  " + argType(c.inType(2), false) + " bias;\n";
    e.init += "  epilogue.bias = in2;\n";
    e.body += "    v += bias[n];\n";
  }
  if (act == "gelu") {
    e.members += "  " + argType(c.outType(1), true) + " pre;\n";
    e.init += "  epilogue.pre = out1;\n";
    e.body += std::string("    pa::storage::storeUnread(") + (c.outType(1) == DType::BF16 ? "pre.p" : "pre") + ", i, v);\n";
    e.body += "    v = " + geluOf("v") + ";\n";
    e.moreThanC = true;
  }
  if (act == "relu") e.body += "    v = fmaxf(v, 0.0f);\n";
  if (act == "swiglu") {
    // One GEMM for both projections: the pre-activations (gate, up column pairs, with their
    // biases) are the product's output, out1, and a pair epilogue writes silu(gate)·up to out0.
    e.members += "  " + argType(c.outType(0), true) + " h;\n";
    e.init += "  epilogue.h = out0;\n";
    // A bf16 h rounds away 2^-9 of each value, far more than the approximate units lose
    // (kernels/gemm_common.cuh, siluBf16).
    const std::string silu = c.outType(0) == DType::BF16 ? "pa::gemm::siluBf16(v0)" : "v0 / (1.0f + expf(-v0))";
    const std::string hp = c.outType(0) == DType::BF16 ? "h.p" : "h";
    e.cOutput = 1;
    e.pairBody = "    pa::storage::storeUnread(" + hp + ", i >> 1, " + silu + " * v1);\n";  // (i even, not negative)
    e.moreThanC = true;
    return gemm(c, q, e);
  }
  if (act == "rope") e.pairBody = ropePairStatement(c, "v0", "v1", "m", "n");
  return gemm(c, q, e);
}

}  // namespace detail

using namespace detail;

// Note on library GEMMs. cuBLASLt computes the product and, where it can, the bias and ReLU;
// its GELU is the tanh approximation, not the erf form the graph means, so GELU and the
// activation derivatives of matmul-act-grad run here as one elementwise pass over its result.
LibraryGemm libraryGemmOf(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  const Ctx c{g, n};
  LibraryGemm lg;
  switch (n.op) {
  case OpKind::MatMul:
  case OpKind::MatMulActGrad: lg.geometry = matmulGeometry(c); break;
  case OpKind::MatMulBiasGrad:
    lg.geometry = matmulGeometry(c);
    lg.biasGradOf = biasGradInput(n);
    break;
  case OpKind::FusedLinear: {
    lg.geometry = fusedLinearGeometry(c);
    lg.bias = n.inputs.size() == 3;
    const std::string act = n.attrs.get<attr::Activation>();
    lg.relu = act == "relu";
    lg.output = act == "gelu" || act == "swiglu" ? 1 : 0;  // the saved pre-activation; out0 = GELU(out1) or SwiGLU's pairs afterwards
    break;
  }
  default: return lg;
  }
  lg.supported = true;
  return lg;
}

NodeKernels libraryGemmEpilogue(const Graph& g, NodeId id, bool libraryBias, bool libraryRelu) {
  const Node& n = g.node(id);
  const Ctx c{g, n};
  const LibraryGemm lg = libraryGemmOf(g, id);
  assert(lg.supported);
  const int64_t count = numel(c.out(0));
  std::string body;
  std::vector<KernelArg> args;
  if (n.op == OpKind::MatMulBiasGrad) return libraryBias ? NodeKernels{} : columnSums(c, lg.biasGradOf, 1);
  if (n.op == OpKind::MatMulActGrad) {
    body = "    const float s = in2[i];\n    out0[i] = " + activationGradOf(n.attrs.get<attr::GradActivation>(), "v", "s") + ";\n";
    args = {{KernelArg::Input, 2}, {KernelArg::Output, 0}};
  } else if (n.op == OpKind::FusedLinear && n.attrs.get<attr::Activation>() == "swiglu") {
    NodeKernels nk;
    if (lg.bias && !libraryBias)
      nk.kernels.push_back(finish(c, "epilogue", kLibraryEpilogue,
                                  {{"COUNT", ll(numel(c.out(1)))}, {"SOURCE", "out1"}, {"BODY", "    out1[i] = v + in2[i % " + ll(lg.geometry.n) + "];\n"}},
                                  {gridFor(numel(c.out(1))), 1, 1}, kThreads, {{KernelArg::Input, 2}, {KernelArg::Output, 1}}));
    nk.kernels.push_back(perIndexKernel(c, "swiglu", numel(c.out(0)), 2, "        x[0] = out1[2 * i], x[1] = out1[2 * i + 1];\n",
                                        "        out0[i] = x[0] / (1.0f + expf(-x[0])) * x[1];\n", {{KernelArg::Output, 1}, {KernelArg::Output, 0}}));
    return nk;
  } else if (n.op == OpKind::FusedLinear && n.attrs.get<attr::Activation>() == "rope") {
    // Column pair by column pair of the product, turned in place (after the bias, if the library did not add it).
    const int64_t units = lg.geometry.n;
    const std::string at = "        const long long at = 2 * i, m = at / " + ll(units) + ", n = at % " + ll(units) + ";\n";
    std::string loads = at + "        (void)m, (void)n;\n        x[0] = out0[at], x[1] = out0[at + 1];\n";
    args = {{KernelArg::Output, 0}};
    if (lg.bias && !libraryBias) {
      loads += "        x[0] += in2[n], x[1] += in2[n + 1];\n";
      args.insert(args.begin(), {KernelArg::Input, 2});
    }
    const std::string stores = at + "        float v0 = x[0], v1 = x[1];\n" + ropePairStatement(c, "v0", "v1", "m", "n") +
                               "        out0[at] = v0;\n        out0[at + 1] = v1;\n";
    NodeKernels nk;
    nk.kernels.push_back(perIndexKernel(c, "rope", count / 2, 2, loads, stores, args));
    return nk;
  } else if (n.op == OpKind::FusedLinear) {
    const bool gelu = lg.output == 1;
    const bool addBias = lg.bias && !libraryBias, relu = lg.relu && !libraryRelu;
    if (!gelu && !addBias && !relu) return {};
    if (addBias) {
      body += "    v += in2[i % " + ll(lg.geometry.n) + "];\n";
      args.push_back({KernelArg::Input, 2});
    }
    if (gelu) {
      if (addBias) body += "    out1[i] = v;\n";
      body += "    out0[i] = " + geluOf("v") + ";\n";
      args.push_back({KernelArg::Output, 0});
      args.push_back({KernelArg::Output, 1});
    } else {
      body += relu ? "    out0[i] = fmaxf(v, 0.0f);\n" : "    out0[i] = v;\n";
      args.push_back({KernelArg::Output, 0});
    }
  } else {
    return {};  // MatMul: the product is the result
  }
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "epilogue", kLibraryEpilogue,
                              {{"COUNT", ll(count)}, {"SOURCE", "out" + std::to_string(lg.output)}, {"BODY", body}},
                              {gridFor(count), 1, 1}, kThreads, args));
  return nk;
}

NodeKernels libraryGemmTransposeB(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  const Ctx c{g, n};
  const LibraryGemm lg = libraryGemmOf(g, id);
  assert(lg.supported && lg.geometry.transB && lg.geometry.batch == 1);
  const int64_t nn = lg.geometry.n, k = lg.geometry.k;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "transpose_b", kGemmTranspose, {{"R", ll(nn)}, {"C", ll(k)}, {"OFFSET", "0"}, {"INPUT", "1"}},
                              {static_cast<unsigned>((k + 31) / 32), static_cast<unsigned>((nn + 31) / 32), 1}, kThreads,
                              {{KernelArg::Input, 1}, {KernelArg::Scratch, 0}}));
  nk.scratchBytes = static_cast<size_t>(nn * k) * sizeof(float);
  return nk;
}

}  // namespace pa::codegen
