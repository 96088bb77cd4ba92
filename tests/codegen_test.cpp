// Codegen through NVRTC: every kernel of every config's training graph (fused and unfused)
// compiles for sm_80 and sm_90a, dumped kernels are self-contained, and the kernel cache
// works. Needs the CUDA toolkit's NVRTC, no GPU (label nvrtc); codegen_emit_test.cpp checks the
// emitted source without it.
#include <gtest/gtest.h>

#include <array>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <map>
#include <vector>

#include "codegen/embedded_kernels.h"
#include "codegen/emit.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "codegen/training_kernels.h"
#include "common/mlp_limits.h"
#include "graph/node_attrs.h"
#include "passes/autodiff.h"
#include "passes/fusion.h"
#include "tests/nvrtc/compile_in_parallel.h"
#include "tests/op_cases.h"
#include "tests/test_util.h"
#include "tests/training_graph.h"

namespace pa {
namespace {

using test::trainingGraph;

struct GraphCase {
  std::string config;
  bool noFuse;
  std::string precision = "fp32";
  std::vector<std::string> sets = {};
  std::string label = "";  // names a case with `sets`
  std::string name() const {
    return config + (noFuse ? "_unfused" : "_fused") + (precision == "fp32" ? "" : "_" + precision) + label;
  }
};

// fuse-qkv on: the packed projection, its concatenated weights and split gradients, the rope of
// the packed Q and K.
const std::vector<std::string> kQkv = {"compiler.fuse=[linear, attention, qkv, norm, elementwise]"};
// fuse-mlp on: each MLP one forward and one backward kernel (fused-mlp, fused-mlp-grad).
const std::vector<std::string> kMlp = {"compiler.fuse=[linear, elementwise, mlp]"};

const std::vector<GraphCase> kGraphCases = {
    {"sine_mlp", false},          {"sine_mlp", true},          {"sine_attention", false},
    {"sine_attention", true},     {"function_mlp", false},     {"function_mlp", true},
    {"mlp_tiny", false},          {"mlp_tiny", true},          {"mlp_wide", false},
    {"mlp_wide", true},           {"attn_block", false},       {"attn_block", true},
    {"sine_mlp", false, "bf16"},  {"sine_mlp", true, "bf16"},  {"sine_attention", false, "bf16"},
    {"sine_attention", true, "bf16"}, {"function_mlp", false, "bf16"}, {"mlp_tiny", false, "bf16"},
    {"mlp_wide", false, "bf16"},  {"attn_block", false, "bf16"}, {"attn_block", true, "bf16"},
    {"tiny_gpt", false},          {"tiny_gpt", false, "bf16"}, {"tiny_llama", true},
    {"sine_attention", false, "fp32", kQkv, "_qkv"}, {"attn_block", false, "bf16", kQkv, "_qkv"},
    {"tiny_llama", false, "fp32", kQkv, "_qkv"}, {"tiny_llama", false, "bf16", kQkv, "_qkv"},
    {"mlp_tiny", false, "fp32", kMlp, "_mlp"}, {"sine_mlp", false, "tf32", kMlp, "_mlp"}, {"function_mlp", false, "fp32", kMlp, "_mlp"},
    {"mlp_tiny", false, "bf16", kMlp, "_mlp"}};

// The runner compiles a graph's kernels as a few programs, each the concatenation of many
// kernels' sources (runtime/cuda_graph_runner.cpp, "Note on parallel compilation"): whatever a
// kernel's source defines besides its kernel must come from an embedded header (included once),
// or two kernels of one kind in a program define it twice. tiny_gpt, fused and in bf16, has
// several kernels of every kind its transformer blocks make.
TEST(GeneratedKernels, AGraphsKernelsCompileAsOneProgram) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  for (const char* precision : {"fp32", "bf16"}) {
    const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/tiny_gpt.yaml",
                                  {"data.samples=16", "data.window=32", "model.input=[32, 8]", "data.delay=5", "train.batch_size=2",
                                   std::string("precision=") + precision});
    DataSplit data = loadData(cfg.data, cfg.seed, std::string(PA_SOURCE_DIR) + "/configs");
    const Graph g = compileTrainingGraph(cfg, RunOptions{}, data.train.xShape, data.train.yShape, cfg.train.batchSize).model.graph;
    codegen::EmitOptions opt;
    opt.wgmma = opt.fullRateFp64 = true;  // as the runner emits on an H100
    test::CompileUnit unit{std::string("tiny_gpt ") + precision + " as one program", "", ""};
    std::map<OpKind, int> kernels;
    for (NodeId id : g.topoOrder()) {
      const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
      if (nk.external) continue;
      for (const codegen::Kernel& k : nk.kernels) {
        unit.source += k.source + "\n";
        if (unit.kernelName.empty()) unit.kernelName = k.name;
        ++kernels[g.node(id).op];
      }
    }
    EXPECT_GE(kernels[OpKind::RmsNorm], 2);
    EXPECT_GE(kernels[OpKind::RmsNormGrad], 2);
    EXPECT_GE(kernels[OpKind::Rope], 2);
    test::CompileOptions options;
    options.arch = "sm_90a";
    for (const std::string& f : test::compileInParallel({unit}, options)) ADD_FAILURE() << f;
  }
}

// Every op case of tests/op_cases.h (the graphs the GPU suite runs: forward and backward through a
// weighted-sum loss, in fp32 and lowered to bf16), each node's kernels compiled for sm_90a, a
// cubin with ptxas, as the runner builds them on an H100. The example configs reach only some
// ops (not the norms or rope, say), so this is where every op's emitter meets NVRTC.
TEST(GeneratedKernels, EveryOpCasesKernelsCompile) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  codegen::EmitOptions opt;
  opt.wgmma = opt.fullRateFp64 = true;  // as the runner emits on an H100
  std::vector<test::CompileUnit> units;
  std::set<OpKind> compiled;
  for (const test::OpCase& oc : test::allCases()) {
    for (bool bf16 : {false, true}) {
      const Graph g = test::opCaseTrainingGraph(oc, bf16);
      const std::string label = oc.name + (bf16 ? "_bf16" : "");
      for (NodeId id : g.topoOrder()) {
        const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
        if (nk.external) continue;
        for (const codegen::Kernel& k : nk.kernels) units.push_back({label + "/" + k.name, k.name, k.source});
        if (!nk.kernels.empty()) compiled.insert(g.node(id).op);
      }
    }
  }
  for (OpKind op : {OpKind::LayerNorm, OpKind::RmsNorm, OpKind::LayerNormGrad, OpKind::RmsNormGrad, OpKind::Rope})
    EXPECT_TRUE(compiled.count(op)) << opName(op) << " has no kernel in any op case";
  test::CompileOptions options;
  options.arch = "sm_90a";
  test::CompileStats stats;
  options.stats = &stats;
  const auto wall = std::chrono::steady_clock::now();
  for (const std::string& f : test::compileInParallel(units, options)) ADD_FAILURE() << f;
  std::printf("sm_90a: %zu kernels, %zu distinct programs; %.1f s wall\n", stats.units, stats.programs,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count());
}

// Every graph's own kernels, for each target in one parallel batch over all the graphs: each
// kernel is its own program, as the runner compiles it, and kernels that differ only in their
// names and banners compile once (tests/nvrtc/compile_in_parallel.h). sm_90a is what the runner
// compiles for on an H100 (with the wgmma GEMMs and fp32 GEMMs on the FP64 tensor cores, as it
// sets EmitOptions::wgmma and fullRateFp64 there; no device gets plain sm_90); sm_80, the Ampere
// path, builds PTX only, with the SIMT fp32 GEMMs of the parts without full-rate FP64. The FlashAttention nodes' kernels
// (NodeKernels::external) are skipped: they are the launcher's instantiations, which
// flash_nvrtc_tests compiles (every one production can choose, and a CPU test checks that every
// example config's choices are among them).
TEST(GeneratedKernels, EveryConfigsKernelsCompileForEveryTarget) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  std::vector<Graph> graphs;
  for (const GraphCase& c : kGraphCases) graphs.push_back(trainingGraph(c.config, c.noFuse, c.precision, c.sets));
  for (const char* arch : {"sm_80", "sm_90a"}) {
    codegen::EmitOptions opt;
    opt.wgmma = opt.fullRateFp64 = std::string(arch) == "sm_90a";
    std::vector<test::CompileUnit> units;
    for (size_t c = 0; c < kGraphCases.size(); ++c) {
      const size_t before = units.size();
      for (NodeId id : graphs[c].topoOrder()) {
        const codegen::NodeKernels nk = codegen::emitNode(graphs[c], id, opt);
        if (nk.external) continue;
        for (const codegen::Kernel& k : nk.kernels) units.push_back({kGraphCases[c].name() + "/" + k.name, k.name, k.source});
      }
      EXPECT_GT(units.size(), before) << kGraphCases[c].name();
    }
    test::CompileOptions options;
    options.arch = arch;
    test::CompileStats stats;
    options.stats = &stats;
    const std::clock_t cpu = std::clock();
    const auto wall = std::chrono::steady_clock::now();
    for (const std::string& f : test::compileInParallel(units, options)) ADD_FAILURE() << f;
    std::printf("%s: %zu kernels, %zu distinct programs; %.1f s CPU, %.1f s wall\n", arch, stats.units, stats.programs,
                double(std::clock() - cpu) / CLOCKS_PER_SEC,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count());
  }
}

// fused-mlp and fused-mlp-grad on awkward shapes: batches of 1, 17, 257, 1000 and 10000 rows (one
// tile; an odd last tile; more tiles than blocks, so the forward strides over tiles and the
// backward's blocks take several each), widths 1, 3, 64, 100 and 128 (odd widths take scalar
// reads, every width at the limit takes more than 48 KB of shared memory and streams its
// weights), 1 to 4 layers, dx and no dx, biases or not, every activation; each emitted for an
// sm_80 target (blocks of their own) and for sm_90a (clusters of 8, and a larger shared-memory
// budget). Compiled for sm_80 and sm_90 (PTX: the front end, the sm_90a source's fallback
// without clusters too) and sm_90a (a cubin through ptxas, as the runner builds for an H100:
// registers and shared memory checked), warnings rejected.
TEST(GeneratedKernels, FusedMlpKernelsCompileForSm80AndSm90) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  struct Case {
    int64_t rows;
    std::vector<int64_t> widths;
    std::string acts;
    std::vector<int64_t> biases;
    bool inputGrad;
  };
  const std::vector<Case> cases = {{1, {3, 1, 3}, "relu,none", {1, 0}, true},
                                   {256, {1, 64, 64, 1}, "relu,relu,none", {1, 1, 1}, false},
                                   {64, {64, 64, 64, 1}, "relu,relu,none", {1, 1, 1}, false},
                                   {17, {1, 3, 64, 128, 1}, "tanh,sigmoid,relu,none", {1, 0, 1, 1}, true},
                                   {1000, {3, 128, 1}, "sigmoid,none", {0, 1}, true},
                                   {1, {128, 128}, "none", {1}, true},
                                   {257, {128, 128, 128, 128}, "tanh,sigmoid,none", {0, 1, 1}, true},
                                   {10000, {100, 7, 100}, "relu,none", {1, 1}, true}};
  std::vector<test::CompileUnit> units;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    Graph g;
    const ValueId x = c.inputGrad ? g.addParam("x", Shape{c.rows, c.widths[0]}, "xavier") : g.addInput("x", Shape{c.rows, c.widths[0]});
    std::vector<ValueId> ins{x};
    for (size_t i = 0; i + 1 < c.widths.size(); ++i) {
      ins.push_back(g.addParam("w" + std::to_string(i), Shape{c.widths[i], c.widths[i + 1]}, "xavier"));
      if (c.biases[i]) ins.push_back(g.addParam("b" + std::to_string(i), Shape{c.widths[i + 1]}, "zeros"));
    }
    test::addWeightedSumLoss(g, g.add(OpKind::FusedMlp, ins, AttrMap().set<attr::MlpActivations>(c.acts).set<attr::MlpBiases>(c.biases)));
    appendBackward(g, g.output("loss"), g.params());
    // Lowered to bf16 too where the hidden outputs are many and odd (cases 3 and 6): the forward
    // stores them and the backward reads them through the bf16 views (kernels/storage.cuh).
    std::vector<std::pair<Graph, std::string>> graphs{{g, ""}};
    if (ci == 3 || ci == 6) {
      graphs.push_back({g, " bf16"});
      lowerToBf16(graphs.back().first);
    }
    for (const auto& [graph, label] : graphs)
      for (bool sm90 : {false, true}) {
        codegen::EmitOptions opt;
        opt.wgmma = sm90;
        int mlpKernels = 0;
        for (NodeId id : graph.topoOrder()) {
          const OpKind op = graph.node(id).op;
          if (op != OpKind::FusedMlp && op != OpKind::FusedMlpGrad) continue;
          const codegen::NodeKernels nk = codegen::emitNode(graph, id, opt);
          ASSERT_EQ(nk.kernels.size(), 1u);
          if (op == OpKind::FusedMlpGrad) {
            EXPECT_GT(nk.scratchBytes, 0u);
          }
          for (const codegen::Kernel& k : nk.kernels) {
            EXPECT_LE(k.sharedBytes, (sm90 ? 227u : 163u) * 1024) << k.name;
            if (!label.empty()) {
              EXPECT_NE(k.source.find("pa_bf16_"), std::string::npos) << k.name;
            }
            units.push_back({"case " + std::to_string(ci) + label + (sm90 ? " sm_90a" : " sm_80") + "/" + k.name, k.name, k.source}),
                ++mlpKernels;
          }
        }
        EXPECT_EQ(mlpKernels, 2);
      }
    // The same layers' fused-mlp-train kernel, where its weights fit (common/mlp_limits.h).
    std::vector<MlpActivation> acts;
    std::string bad;
    ASSERT_TRUE(parseMlpActivations(c.acts, acts, bad));
    int64_t floats = 0;
    for (size_t i = 0; i + 1 < c.widths.size(); ++i) floats += mlpTrainLayerFloats(c.widths[i], c.widths[i + 1], c.biases[i] != 0);
    if (floats > kMlpTrainMaxFloats) continue;
    const Graph t = test::mlpTrainGraph(c.rows, c.widths, acts, c.biases);
    // With the session's Adam in the kernel too where the grid is one cluster on sm_90a (case 1)
    // and where it is several (case 7): the AdamBinding argument, every gradient through AdamOut.
    std::vector<bool> adamVariants{false};
    if (ci == 1 || ci == 7) adamVariants.push_back(true);
    for (bool adam : adamVariants)
      for (bool sm90 : {false, true}) {
        codegen::EmitOptions opt;
        opt.wgmma = sm90;
        opt.adamInTrainNode = adam;
        int trainKernels = 0;
        for (NodeId id : t.topoOrder()) {
          if (t.node(id).op != OpKind::FusedMlpTrain) continue;
          for (const codegen::Kernel& k : codegen::emitNode(t, id, opt).kernels) {
            const bool binds = std::any_of(k.args.begin(), k.args.end(),
                                           [](const codegen::KernelArg& a) { return a.kind == codegen::KernelArg::AdamBinding; });
            EXPECT_EQ(binds, adam) << k.name;
            EXPECT_EQ(k.source.find("pa::mlp::adamOut(") != std::string::npos, adam) << k.name;
            EXPECT_EQ(k.source.find("adam->ring[") != std::string::npos, adam) << k.name;
            units.push_back({"case " + std::to_string(ci) + (adam ? " adam" : "") + (sm90 ? " sm_90a" : " sm_80") + "/" + k.name, k.name,
                             k.source}),
                ++trainKernels;
          }
        }
        EXPECT_EQ(trainKernels, 1);
      }
  }
  for (const char* arch : {"sm_80", "sm_90", "sm_90a"}) {
    test::CompileOptions options;
    options.arch = arch;
    options.rejectWarnings = true;
    for (const std::string& f : test::compileInParallel(units, options)) ADD_FAILURE() << arch << ": " << f;
  }
}

// The backward epilogue fusions' kernels (mse-loss-grad on its one-block and chunked paths,
// matmul-bias-grad on both operand sides, with the split column sum at long K) and the products
// with an extent of 1 (a layer to one output: the row dot, the column product with its bias, the
// outer product; 5 features one value at a time, 8 in 16-byte accesses), fp32 and bf16, for
// sm_80 and sm_90a, warnings rejected.
TEST(GeneratedKernels, EpilogueFusionKernelsCompileForEveryTarget) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  std::vector<Graph> graphs;
  std::vector<bool> toOne;  // per graph: a layer to one output
  for (bool bf16 : {false, true}) {
    for (const auto& [rows, units, features] :
         std::vector<std::array<int64_t, 3>>{{1, 1, 5}, {7, 3, 5}, {257, 129, 5}, {8191, 257, 5}, {8191, 1, 8}, {300, 1, 5}}) {
      for (bool tw : {false, true}) {
        Graph g;
        const ValueId x = g.addParam("x", {rows, features}, "xavier");  // a parameter: dx too
        const ValueId w = g.addParam("w", tw ? Shape{units, features} : Shape{features, units}, "xavier");
        const ValueId y = g.add(OpKind::FusedLinear, {x, w, g.addParam("b", {units}, "xavier")}, AttrMap().set<attr::TransposeW>(tw));
        g.setOutput("loss", g.add(OpKind::MseLoss, {y, g.addInput("target", {rows, units})}, {}, "loss"));
        appendBackward(g, g.output("loss"), g.params());
        for (auto make : {&makeFuseLossGradPattern, &makeFuseBiasGradPattern}) {
          std::vector<std::unique_ptr<RewritePattern>> ps;
          ps.push_back(make());
          EXPECT_EQ(applyPatternsGreedily(g, ps), 1);
        }
        if (bf16) lowerToBf16(g);
        graphs.push_back(std::move(g));
        toOne.push_back(units == 1);
      }
    }
  }
  for (const char* arch : {"sm_80", "sm_90a"}) {
    codegen::EmitOptions opt;
    opt.wgmma = opt.fullRateFp64 = std::string(arch) == "sm_90a";
    std::vector<test::CompileUnit> units;
    std::set<OpKind> seen;
    for (size_t i = 0; i < graphs.size(); ++i)
      for (NodeId id : graphs[i].topoOrder()) {
        const OpKind op = graphs[i].node(id).op;
        // A layer to one output's forward and dx (the others' are GEMMs, compiled elsewhere).
        const bool oneOutput = (op == OpKind::FusedLinear || op == OpKind::MatMul) && toOne[i];
        if (op != OpKind::MseLossGrad && op != OpKind::MatMulBiasGrad && !oneOutput) continue;
        seen.insert(op);
        for (const codegen::Kernel& k : codegen::emitNode(graphs[i], id, opt).kernels)
          units.push_back({"graph " + std::to_string(i) + "/" + k.name, k.name, k.source});
      }
    EXPECT_EQ(seen.size(), 4u);
    test::CompileOptions options;
    options.arch = arch;
    options.rejectWarnings = true;
    for (const std::string& f : test::compileInParallel(units, options)) ADD_FAILURE() << arch << ": " << f;
  }
}

// The runner compiles each distinct kernel once: kernels whose sources are equal under
// codegen::sourceWithoutName share one compiled function. tiny_gpt's step repeats its layers'
// kernels, so there are fewer distinct sources than kernels; and any two kernels equal under it
// are the same text but for the banner and the name (the name put back gives the other's body).
TEST(Codegen, KernelsEqualUpToTheirNamesAreOneKernel) {
  const Graph g = trainingGraph("tiny_gpt", false);
  codegen::EmitOptions opt;
  opt.wgmma = true;
  std::map<std::string, const codegen::Kernel*> first;
  std::vector<codegen::NodeKernels> all;
  for (NodeId id : g.topoOrder()) all.push_back(codegen::emitNode(g, id, opt));
  size_t kernels = 0, shared = 0;
  auto body = [](const std::string& src) {  // without the banner's comment lines
    size_t at = 0;
    while (src.compare(at, 2, "//") == 0) at = src.find('\n', at) + 1;
    return src.substr(at);
  };
  for (const codegen::NodeKernels& nk : all) {
    if (nk.external) continue;
    for (const codegen::Kernel& k : nk.kernels) {
      ++kernels;
      const std::string key = codegen::sourceWithoutName(k);
      EXPECT_EQ(key.find(k.name), std::string::npos) << k.name;
      const auto [it, fresh] = first.emplace(key, &k);
      if (fresh) continue;
      ++shared;
      std::string restored = body(it->second->source);
      for (size_t at = restored.find(it->second->name); at != std::string::npos; at = restored.find(it->second->name, at + 1))
        restored.replace(at, it->second->name.size(), k.name);
      EXPECT_EQ(restored, body(k.source)) << it->second->name << " and " << k.name;
    }
  }
  std::printf("tiny_gpt: %zu kernels, %zu distinct\n", kernels, first.size());
  EXPECT_GT(shared, kernels / 2);  // four layers of the same shapes
  // The name goes where it is an identifier or begins one with '_'; inside other identifiers it
  // stays.
  codegen::Kernel k;
  k.name = "k7_add";
  k.source = "// banner k7_add\nextern \"C\" __global__ void k7_add() { k7_add_helper(); k7_add2(); xk7_add(); }\n";
  EXPECT_EQ(codegen::sourceWithoutName(k), "extern \"C\" __global__ void \x01() { \x01_helper(); k7_add2(); xk7_add(); }\n");
}

// The runner gives each kernel on a GEMM main loop (or the fused MLP) an NVRTC program of its
// own: codegen::compilesSlowly picks exactly the kernels that include those templates.
TEST(Codegen, KernelsOnAGemmMainLoopCompileSlowly) {
  const Graph g = trainingGraph("tiny_gpt", false);
  for (const bool wgmma : {false, true}) {
    codegen::EmitOptions opt;
    opt.wgmma = wgmma;
    int slow = 0, fast = 0;
    for (NodeId id : g.topoOrder()) {
      const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
      if (nk.external) continue;
      for (const codegen::Kernel& k : nk.kernels) {
        bool gemm = false;
        for (const char* h : {"gemm_simt", "gemm_tf32", "gemm_wgmma", "fused_mlp"})
          gemm |= k.source.find("#include \"kernels/" + std::string(h) + ".cuh\"") != std::string::npos;
        EXPECT_EQ(codegen::compilesSlowly(k), gemm) << k.name;
        (codegen::compilesSlowly(k) ? slow : fast) += 1;
      }
    }
    EXPECT_GT(slow, 10) << "wgmma " << wgmma;
    EXPECT_GT(fast, 10) << "wgmma " << wgmma;
  }
}

// Every generated kernel of tiny_gpt's training step as the runner emits it on sm_90a.
std::vector<codegen::Kernel> tinyGptWgmmaKernels() {
  const Graph g = trainingGraph("tiny_gpt", false);
  codegen::EmitOptions opt;
  opt.wgmma = true;
  std::vector<codegen::Kernel> out;
  for (NodeId id : g.topoOrder()) {
    const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
    if (!nk.external) out.insert(out.end(), nk.kernels.begin(), nk.kernels.end());
  }
  return out;
}

// The runner's NVRTC programs: every kernel in exactly one, slow ones alone and first, the
// others eight to a program in their order (only the last pack shorter).
TEST(Codegen, KernelsSplitIntoSmallPrograms) {
  const std::vector<codegen::Kernel> owned = tinyGptWgmmaKernels();
  std::vector<const codegen::Kernel*> kernels;
  for (const codegen::Kernel& k : owned) kernels.push_back(&k);
  const std::vector<std::vector<size_t>> programs = codegen::splitIntoPrograms(kernels);
  std::vector<int> seen(kernels.size(), 0);
  size_t slow = 0, packs = 0, shortPacks = 0;
  for (const std::vector<size_t>& p : programs) {
    ASSERT_FALSE(p.empty());
    if (p.size() == 1 && codegen::compilesSlowly(*kernels[p[0]])) {
      EXPECT_EQ(packs, 0u) << "a slow program after a packed one";
      ++slow;
    } else {
      ++packs;
      EXPECT_LE(p.size(), 8u);
      shortPacks += p.size() < 8;
      for (size_t i : p) EXPECT_FALSE(codegen::compilesSlowly(*kernels[i])) << kernels[i]->name;
    }
    for (size_t j = 0; j < p.size(); ++j) {
      ++seen[p[j]];
      if (j > 0) {
        EXPECT_LT(p[j - 1], p[j]);
      }
    }
  }
  for (size_t i = 0; i < kernels.size(); ++i) EXPECT_EQ(seen[i], 1) << kernels[i]->name;
  EXPECT_GT(slow, 10u);
  EXPECT_GT(packs, 2u);
  EXPECT_LE(shortPacks, 1u);
}

// The runner compiles each kernel under codegen::compiledName: kernels equal but for their names
// (another graph's numbering of the same node) get one name and one program text, so one cache
// entry; the program NVRTC makes of it defines that name and no other kernel's.
TEST(Codegen, KernelsCompileUnderANameTheirGraphDoesNotChoose) {
  const std::vector<codegen::Kernel> all = tinyGptWgmmaKernels();
  // The same kernel numbered otherwise: another banner, another node id in every use of its name.
  auto renumbered = [](const codegen::Kernel& k) {
    codegen::Kernel r = k;
    r.name = "k98765" + k.name.substr(k.name.find('_'));
    r.source = "// another graph's banner\n";
    for (size_t at = k.source.find('\n', 0) + 1; at < k.source.size();) {  // the banner's first line goes
      const size_t hit = k.source.find(k.name, at);
      r.source += k.source.substr(at, hit == std::string::npos ? std::string::npos : hit - at);
      if (hit == std::string::npos) break;
      r.source += r.name;
      at = hit + k.name.size();
    }
    return r;
  };
  std::set<std::string> names;
  std::map<std::string, std::string> nameOfKey;
  const codegen::Kernel* gemm = nullptr;
  const codegen::Kernel* small = nullptr;
  for (const codegen::Kernel& k : all) {
    const std::string key = codegen::sourceWithoutName(k);
    const std::string name = codegen::compiledName(k, key);
    EXPECT_EQ(name.rfind("pa_", 0), 0u) << name;
    EXPECT_NE(name.find(k.name.substr(k.name.find('_') + 1)), std::string::npos) << k.name << " " << name;
    const codegen::Kernel r = renumbered(k);
    const std::string rkey = codegen::sourceWithoutName(r);
    EXPECT_EQ(rkey, key) << k.name;
    EXPECT_EQ(codegen::compiledName(r, rkey), name) << k.name;
    const std::string text = codegen::sourceNamed(key, name);
    EXPECT_EQ(text.find(k.name), std::string::npos) << k.name;
    EXPECT_NE(text.find(" " + name + "("), std::string::npos) << k.name;
    const auto [it, fresh] = nameOfKey.emplace(key, name);
    if (fresh) {
      EXPECT_TRUE(names.insert(name).second) << "two sources named " << name;
    }
    if (!gemm && codegen::compilesSlowly(k)) gemm = &k;
    if (!small && !codegen::compilesSlowly(k)) small = &k;
  }
  EXPECT_GT(names.size(), 20u);
  ASSERT_TRUE(gemm && small);
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  for (const codegen::Kernel* k : {gemm, small}) {
    const std::string key = codegen::sourceWithoutName(*k);
    const std::string name = codegen::compiledName(*k, key);
    codegen::CompileRequest req;
    req.kernelName = name;
    req.source = codegen::sourceNamed(key, name);
    req.headers = codegen::embeddedKernelHeaders();
    req.arch = "sm_90a";
    req.extraOptions = {"-lineinfo"};
    const codegen::CompileResult r = nvrtc.compile(req);
    const std::string cubin(r.cubin.begin(), r.cubin.end());
    std::printf("%s (%s): %zu bytes of cubin\n", name.c_str(), k->name.c_str(), cubin.size());
    EXPECT_NE(cubin.find(name + '\0'), std::string::npos) << name << " is not in the cubin";
    EXPECT_EQ(cubin.find(k->name), std::string::npos) << k->name << " is in the cubin";
  }
}

TEST(Codegen, DumpedKernelsAreSelfContained) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  const Graph g = trainingGraph("sine_attention", true);  // unfused: it has attention-mask kernels
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pa_dump_" + std::to_string(::getpid()));
  const int n = codegen::dumpKernels(g, dir.string());
  EXPECT_GT(n, 10);
  // Without any embedded header available, the mask kernel still compiles: its header is inline.
  bool sawMask = false;
  std::vector<test::CompileUnit> units;
  for (NodeId id : g.topoOrder()) {
    for (const codegen::Kernel& k : codegen::emitNode(g, id).kernels) {
      if (k.headers.empty()) continue;
      sawMask = true;
      const std::string src = codegen::selfContainedSource(k);
      EXPECT_EQ(src.find("#include \"kernels/"), std::string::npos);
      EXPECT_TRUE(std::filesystem::exists(dir / (k.name + ".cu")));
      units.push_back({k.name, k.name, src});
    }
  }
  test::CompileOptions options;
  options.arch = "sm_90";
  options.embeddedHeaders = false;
  for (const std::string& f : test::compileInParallel(units, options)) ADD_FAILURE() << f;
  EXPECT_TRUE(sawMask);
  std::filesystem::remove_all(dir);
}

// bf16 kernels include kernels/storage.cuh (or a kernels/gemm_*.cuh, which includes it): one kernel
// of each op of the bf16 graphs compiles on its own with the header pasted in.
TEST(Codegen, DumpedBf16KernelsAreSelfContained) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  std::vector<test::CompileUnit> units;
  for (bool noFuse : {false, true}) {
    const Graph g = trainingGraph(noFuse ? "sine_attention" : "attn_block", noFuse, "bf16");
    std::set<OpKind> seen;
    for (NodeId id : g.topoOrder()) {
      const codegen::NodeKernels nk = codegen::emitNode(g, id);
      if (nk.external || nk.kernels.empty() || !seen.insert(g.node(id).op).second) continue;
      for (const codegen::Kernel& k : nk.kernels) {
        const std::string src = codegen::selfContainedSource(k);
        EXPECT_EQ(src.find("#include \"kernels/"), std::string::npos) << k.name;
        units.push_back({k.name, k.name, src});
      }
    }
  }
  test::CompileOptions options;
  options.arch = "sm_90";
  options.embeddedHeaders = false;
  for (const std::string& f : test::compileInParallel(units, options)) ADD_FAILURE() << f;
  const size_t compiled = units.size();
  EXPECT_GT(compiled, 10u);
}

codegen::CompileRequest smallKernel(const std::string& body = "out[threadIdx.x] = 2.0f;") {
  codegen::CompileRequest r;
  r.kernelName = "cache_probe";
  r.source = "extern \"C\" __global__ void cache_probe(float* out) { " + body + " }\n";
  r.arch = "sm_80";
  return r;
}

TEST(KernelCache, HitsInMemoryThenOnDiskAcrossInstances) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << "NVRTC not found";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pa_kcache_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::vector<char> first;
  {
    codegen::KernelCache cache(dir.string());
    first = cache.compile(smallKernel()).cubin;
    const std::vector<char> again = cache.compile(smallKernel()).cubin;
    EXPECT_EQ(first, again);
    EXPECT_EQ(cache.stats().misses, 1);
    EXPECT_EQ(cache.stats().memoryHits, 1);
  }
  codegen::KernelCache fresh(dir.string());  // a new process, in effect
  EXPECT_EQ(fresh.compile(smallKernel()).cubin, first);
  EXPECT_EQ(fresh.stats().diskHits, 1);
  EXPECT_EQ(fresh.stats().misses, 0);
  std::filesystem::remove_all(dir);
}

TEST(KernelCache, CorruptEntryIsDetectedAndRebuilt) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << "NVRTC not found";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pa_kcache_bad_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  codegen::KernelCache writer(dir.string());
  const std::vector<char> good = writer.compile(smallKernel()).cubin;
  const std::filesystem::path entry = dir / (writer.keyOf(smallKernel()) + ".cubin");
  ASSERT_TRUE(std::filesystem::exists(entry));
  for (int damage = 0; damage < 2; ++damage) {
    {  // 0: flip a byte of the payload; 1: cut the file short
      std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
      const auto size = std::filesystem::file_size(entry);
      if (damage == 0) {
        f.seekg(static_cast<std::streamoff>(size - 10));
        char c;
        f.get(c);
        f.seekp(static_cast<std::streamoff>(size - 10));
        f.put(static_cast<char>(c ^ 0x5a));
      }
      f.close();
      if (damage == 1) std::filesystem::resize_file(entry, size / 2);
    }
    codegen::KernelCache reader(dir.string());
    EXPECT_EQ(reader.compile(smallKernel()).cubin, good) << "damage " << damage;
    EXPECT_EQ(reader.stats().corruptRebuilt, 1) << "damage " << damage;
    EXPECT_EQ(reader.stats().misses, 1) << "damage " << damage;
    codegen::KernelCache again(dir.string());  // the rewritten entry is good again
    again.compile(smallKernel());
    EXPECT_EQ(again.stats().diskHits, 1) << "damage " << damage;
  }
  std::filesystem::remove_all(dir);
}

// The compile pool's loop (the runner's programs, the FlashAttention kernels, these tests): every
// item once, on several threads where there are cores, and the first failing item's exception
// after all have run.
TEST(KernelCache, CompileEachRunsEveryItemOnceAndRethrowsTheFirstFailure) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{200}}) {
    std::vector<std::atomic<int>> calls(count);
    codegen::compileEach(count, [&](size_t i) { ++calls[i]; });
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(calls[i].load(), 1) << "item " << i << " of " << count;
  }
  std::vector<std::atomic<int>> calls(50);
  try {
    codegen::compileEach(calls.size(), [&](size_t i) {
      ++calls[i];
      if (i == 31 || i == 12 || i == 40) throw std::runtime_error("item " + std::to_string(i));
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 12");
  }
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i].load(), 1) << "item " << i << " after failures";
}

TEST(KernelCache, KeyCoversSourceHeadersArchAndOptions) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << "NVRTC not found";
  const codegen::KernelCache cache("");
  const std::string base = cache.keyOf(smallKernel());
  codegen::CompileRequest r = smallKernel();
  EXPECT_EQ(cache.keyOf(r), base);
  r.arch = "sm_90";
  EXPECT_NE(cache.keyOf(r), base);
  r = smallKernel();
  r.extraOptions = {"-lineinfo"};
  EXPECT_NE(cache.keyOf(r), base);
  r = smallKernel();
  r.headers = {{"h.h", "// x"}};
  EXPECT_NE(cache.keyOf(r), base);
  EXPECT_NE(cache.keyOf(smallKernel("out[threadIdx.x] = 3.0f;")), base);
}

// The training step's own kernels (batch gather, gradient norm, Adam with its bf16 mirror
// stores, loss record) compile as the session builds them (with the embedded headers, for
// kernels/pdl.cuh), for every production target, with no warning: sm_90a as a cubin, sm_80 and
// sm_75 (the software rounding branch, no griddepcontrol) as PTX.
TEST(GeneratedKernels, TrainingKernelsCompileForEveryTarget) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  const std::string src = codegen::trainingKernelsSource();
  for (const char* name : {"pa_gather_rows", "pa_grad_sumsq", "pa_clip_scale", "pa_adam_multi", "pa_record_loss"})
    EXPECT_NE(src.find(std::string(name) + "("), std::string::npos) << name;
  for (const char* arch : {"sm_90a", "sm_80", "sm_75"}) {
    test::CompileOptions options;
    options.arch = arch;
    options.rejectWarnings = true;
    for (const std::string& f : test::compileInParallel({{std::string("training kernels ") + arch, "pa_adam_multi", src}}, options))
      ADD_FAILURE() << f;
  }
}

// The PDL prologue (kernels/pdl.cuh) is in the code of every kernel family for sm_90 and later,
// and compiled out for sm_80: each kernel's PTX waits on its prerequisite grids and then lets its
// dependents launch; sm_80's has neither instruction (the PTX ISA has them from sm_90 only).
TEST(GeneratedKernels, PdlPrologueIsCompiledForSm90AndOutForSm80) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  std::vector<std::pair<std::string, std::string>> sources = {{"training kernels", codegen::trainingKernelsSource()}};
  const Graph g = trainingGraph("sine_attention", false);
  bool generated = false, flash = false;  // the first of each in the fused training graph
  for (NodeId id : g.topoOrder()) {
    const codegen::NodeKernels nk = codegen::emitNode(g, id);
    bool& taken = nk.external ? flash : generated;
    if (nk.kernels.empty() || taken) continue;
    sources.push_back({nk.kernels[0].name, nk.kernels[0].source});
    taken = true;
  }
  ASSERT_TRUE(generated && flash);
  for (const auto& [name, source] : sources) {
    for (const char* arch : {"compute_90", "compute_80"}) {
      codegen::CompileRequest req;
      req.kernelName = name;
      req.source = source;
      req.headers = codegen::embeddedKernelHeaders();
      req.arch = arch;
      const std::string ptx = nvrtc.compile(req).ptx;
      ASSERT_FALSE(ptx.empty()) << name << " " << arch;
      const size_t wait = ptx.find("griddepcontrol.wait"), launch = ptx.find("griddepcontrol.launch_dependents");
      if (std::string(arch) == "compute_90") {
        EXPECT_NE(wait, std::string::npos) << name;
        EXPECT_NE(launch, std::string::npos) << name;
        EXPECT_LT(wait, launch) << name << ": the wait comes first";
      } else {
        EXPECT_EQ(wait, std::string::npos) << name;
        EXPECT_EQ(launch, std::string::npos) << name;
      }
    }
  }
}

}  // namespace
}  // namespace pa
