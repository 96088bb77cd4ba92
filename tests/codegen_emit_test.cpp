// Codegen without NVRTC (CPU suite): every op of the training graphs has kernels, the
// FlashAttention nodes emit the launcher's wgmma and TF32 choices, and the source is
// byte-identical run to run. codegen_test.cpp compiles the kernels (label nvrtc).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "codegen/flops.h"
#include "common/attention_mask.h"
#include "graph/node_attrs.h"
#include "passes/autodiff.h"
#include "tests/op_cases.h"
#include "tests/training_graph.h"

namespace pa {
namespace {

using test::trainingGraph;

TEST(CodegenEmit, EveryOpOfTheTrainingGraphsHasKernelsExceptLeaves) {
  for (const char* name : {"sine_attention", "attn_block"}) {
    for (bool noFuse : {false, true}) for (const char* precision : {"fp32", "bf16"}) {
      const Graph g = trainingGraph(name, noFuse, precision);
      for (NodeId id : g.topoOrder()) {
        const Node& n = g.node(id);
        const bool leaf = n.op == OpKind::Input || n.op == OpKind::Param || n.op == OpKind::Constant;
        EXPECT_EQ(codegen::emitNode(g, id).kernels.empty(), leaf) << n.name << " (" << opName(n.op) << ")";
      }
    }
  }
}

// --dump-kernels writes what the GPU runner launches: no copy kernel for a reshape that shares its
// input's bytes (in the arena, or a parameter's), one for a reshape that changes the dtype.
TEST(CodegenEmit, DumpLeavesOutReshapesThatShareTheirInputsBytes) {
  Graph g;
  const ValueId w = g.addParam("w", {4, 6}, "xavier");
  const ValueId x = g.addInput("x", {2, 3});
  const ValueId wr = g.add(OpKind::Reshape, {w}, AttrMap().set<attr::Shape>({2, 12}));  // a parameter's bytes
  const ValueId r = g.add(OpKind::Relu, {x});
  const ValueId rr = g.add(OpKind::Reshape, {r}, AttrMap().set<attr::Shape>({6}));  // the arena's bytes
  g.setOutput("p", g.add(OpKind::Permute, {wr}, AttrMap().set<attr::Perm>({1, 0})));
  g.setOutput("s", g.add(OpKind::Relu, {rr}));
  g.setStorageTypes();
  const ValueId b = g.add(OpKind::Cast, {r}, AttrMap().set<attr::DType>("bf16"));
  g.setDtype(b, DType::BF16);
  const ValueId br = g.add(OpKind::Reshape, {b}, AttrMap().set<attr::Shape>({6}));
  g.setDtype(br, DType::F32);  // read back as fp32: a copy
  g.setOutput("c", br);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pa_dump_alias_" + std::to_string(::getpid()));
  const int written = codegen::dumpKernels(g, dir.string());
  std::vector<std::string> reshapes;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find("_reshape") != std::string::npos) reshapes.push_back(e.path().filename().string());
  ASSERT_EQ(reshapes.size(), 1u);  // only the dtype-changing one
  EXPECT_EQ(reshapes[0], "k" + std::to_string(g.producer(br).id) + "_reshape.cu");
  EXPECT_EQ(written, 5);  // relu, permute, relu, cast, the copying reshape
  std::filesystem::remove_all(dir);
}

// Nor a kernel for a node that only unpacks a parameter's gradient from a packed one (fuse-qkv's
// slices, SwiGLU's deinterleaves: the GPU session's Adam reads them in place); the slice of a
// gradient that another node reads is still written.
TEST(CodegenEmit, DumpLeavesOutTheUnpackingOfPackedParameterGradients) {
  const Graph g = trainingGraph("tiny_llama", false, "fp32", {"data.window=16", "model.input=[16, 8]", "data.delay=4"});
  const std::vector<std::vector<NodeId>> users = g.users();
  int unpacking = 0, slices = 0;
  for (ValueId p : g.params()) unpacking += unpackingOfParamGradient(g, p, users) >= 0;
  for (NodeId id : g.topoOrder()) slices += g.node(id).op == OpKind::Slice || g.node(id).op == OpKind::Deinterleave;
  EXPECT_EQ(unpacking, 20);  // four blocks: Q, K, V and gate, up
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pa_dump_unpack_" + std::to_string(::getpid()));
  const int written = codegen::dumpKernels(g, dir.string());
  int dumpedUnpacking = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    dumpedUnpacking += f.find("_slice") != std::string::npos || f.find("_deinterleave") != std::string::npos;
  }
  EXPECT_EQ(dumpedUnpacking, slices - unpacking);
  EXPECT_GT(written, 0);
  std::filesystem::remove_all(dir);
}

// The forward, dK/dV and dQ kernels the FlashAttention nodes of `g` emit (not the preprocess and
// reduce kernels, which have no wgmma or TF32 form).
std::vector<codegen::Kernel> flashProductKernels(const Graph& g, const codegen::EmitOptions& opt) {
  std::vector<codegen::Kernel> out;
  for (NodeId id : g.topoOrder()) {
    const OpKind op = g.node(id).op;
    if (op != OpKind::FlashAttention && op != OpKind::FlashAttentionGrad && op != OpKind::FlashAttentionQkv &&
        op != OpKind::FlashAttentionQkvGrad)
      continue;  // (the packed nodes, which the examples' qkv makes, launch the same kernels)
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      if (k.name.find("_fwd_") != std::string::npos || k.name.find("_dkdv_") != std::string::npos ||
          k.name.find("_dq_") != std::string::npos)
        out.push_back(k);
  }
  return out;
}

// --dump-kernels on an H100 writes what the launcher runs there: the FlashAttention nodes of a bf16
// graph (attn_block: head dim 64) emit the wgmma instantiations for sm_90a targets only.
TEST(CodegenEmit, FlashNodesEmitTheLaunchersWgmmaChoiceOnSm90a) {
  const Graph g = trainingGraph("attn_block", false, "bf16");
  for (bool wgmma : {false, true}) {
    codegen::EmitOptions opt;
    opt.wgmma = wgmma;
    const std::vector<codegen::Kernel> flash = flashProductKernels(g, opt);
    size_t onWgmma = 0;
    for (const codegen::Kernel& k : flash) {
      if (k.name.find("_wg_") == std::string::npos) continue;
      ++onWgmma;
      EXPECT_NE(k.source.find("_wgmma.cuh"), std::string::npos) << k.name;
    }
    EXPECT_EQ(flash.size(), 3u) << "forward, dK/dV and dQ";
    EXPECT_EQ(onWgmma, wgmma ? flash.size() : 0) << "wgmma " << wgmma;
  }
}

// precision: tf32 puts an fp32 graph's attention on the TF32 tensor cores: its forward, dK/dV and
// dQ kernels are the mma.sync instantiations with TF32Tag; without it, the exact FFMA ones.
TEST(CodegenEmit, Tf32PutsFp32AttentionOnTensorCores) {
  const Graph g = trainingGraph("attn_block", false);
  for (bool tf32 : {false, true}) {
    codegen::EmitOptions opt;
    opt.tf32 = tf32;
    const std::vector<codegen::Kernel> flash = flashProductKernels(g, opt);
    size_t onTf32 = 0;
    for (const codegen::Kernel& k : flash) {
      if (k.name.find("_tf32_") == std::string::npos) continue;
      ++onTf32;
      EXPECT_NE(k.source.find("pa::flash::TF32Tag"), std::string::npos) << k.name;
    }
    EXPECT_GE(flash.size(), 2u) << "forward and dK/dV at least";
    EXPECT_EQ(onTf32, tf32 ? flash.size() : 0) << "tf32 " << tf32;
  }
}

TEST(CodegenEmit, SourceIsByteIdenticalRunToRun) {
  auto all = [](const Graph& g) {
    std::string s;
    for (NodeId id : g.topoOrder())
      for (const codegen::Kernel& k : codegen::emitNode(g, id).kernels) s += k.name + "\n" + k.source;
    return s;
  };
  const std::string a = all(trainingGraph("sine_attention", false));
  const std::string b = all(trainingGraph("sine_attention", false));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

// The model FLOPs of a step (codegen/flops.h) are 6 × weights × tokens for the linear layers plus
// 3.5 × 4·B·Hq·D × (visible query-key pairs) for each attention, the pairs counted here key by
// key with the mask predicate, and the weights from the parameters (every 2-D "weight").
TEST(CodegenEmit, ModelFlopsAreSixTimesWeightsTimesTokensPlusAttention) {
  for (const char* name : {"sine_attention", "attn_block", "tiny_gpt", "tiny_llama", "tiny_llama qkv"}) {
    const bool qkv = std::string(name) == "tiny_llama qkv";
    const Graph g = qkv ? trainingGraph("tiny_llama", false, "fp32", {"compiler.fuse=[linear, attention, qkv, norm, elementwise]"})
                        : trainingGraph(name, /*noFuse=*/false);
    const Shape x = g.shape(g.findValue("input"));
    const double tokens = static_cast<double>(numel(x) / x.back());
    double weights = 0;
    for (ValueId p : g.params()) {
      const std::string& n = g.value(p).name;
      if (g.shape(p).size() == 2 && n.size() >= 6 && n.compare(n.size() - 6, 6, "weight") == 0) weights += static_cast<double>(numel(g.shape(p)));
    }
    double attention = 0;
    int layers = 0;
    for (NodeId id : g.topoOrder()) {
      if (g.node(id).op != OpKind::FlashAttention && g.node(id).op != OpKind::FlashAttentionQkv) continue;
      const FlashAttentionConfig f = codegen::flashConfigOf(g, g.node(id));
      double pairs = 0;
      for (long long q = 0; q < f.qLen; ++q)
        for (long long k = 0; k < f.kLen; ++k) pairs += keyVisible(f.mask, q, k, f.qLen, f.kLen);
      attention += 3.5 * 4.0 * f.batch * f.heads * f.headDim * pairs;
      ++layers;
    }
    EXPECT_GE(layers, 1) << name;
    const double expected = 6.0 * weights * tokens + attention;
    EXPECT_NEAR(codegen::modelFlops(g), expected, 1e-12 * expected) << name;
  }
}

// A SumTo over leading axes (a bias gradient) is one column-sums launch, 16-byte groups where the
// width holds whole ones (8 bf16 or 4 fp32 values) and one value at a time where it does not;
// other SumTos keep the general reduction.
TEST(CodegenEmit, SumToOverLeadingAxesIsOneColumnSumsLaunch) {
  struct Want {
    const char* name;
    bool bf16;
    const char* vec;  // "" when not the column sums
  };
  int checked = 0;
  for (const Want& w : {Want{"SumTo_columns", false, "VEC = 4,"}, Want{"SumTo_columns", true, "VEC = 8,"},
                        Want{"SumTo_columnsOdd", false, "VEC = 1,"}, Want{"SumTo_columnsOdd", true, "VEC = 1,"},
                        Want{"SumTo_oneColumn", true, "VEC = 1,"}, Want{"SumTo", false, ""}}) {
    SCOPED_TRACE(std::string(w.name) + (w.bf16 ? " bf16" : " fp32"));
    for (const test::OpCase& oc : test::allCases()) {
      if (oc.name != w.name) continue;
      const Graph g = test::opCaseTrainingGraph(oc, w.bf16);
      for (NodeId id : g.topoOrder()) {
        const Node& n = g.node(id);
        if (n.op != OpKind::SumTo) continue;
        if (w.bf16 && std::string(w.name) != "SumTo_columnsOdd") {
          EXPECT_EQ(g.value(n.inputs[0]).type.dtype, DType::BF16);
        }
        const codegen::NodeKernels nk = codegen::emitNode(g, id);
        ASSERT_EQ(nk.kernels.size(), 1u);
        const std::string& src = nk.kernels[0].source;
        EXPECT_EQ(src.find("colsums") != std::string::npos, *w.vec != 0) << nk.kernels[0].name;
        if (*w.vec) {
          EXPECT_NE(src.find(w.vec), std::string::npos) << src.substr(0, 600);
          EXPECT_TRUE(nk.zeroScratch);
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6);
}

}  // namespace
}  // namespace pa
