// Codegen: every kernel of every config's training graph (fused and unfused) compiles with
// NVRTC for sm_80 and sm_90, the generated source is byte-identical run to run, and a dumped
// kernel is self-contained. Needs the CUDA toolkit's NVRTC, no GPU (label nvrtc).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <fstream>
#include <set>
#include <vector>

#include "codegen/embedded_kernels.h"
#include "codegen/emit.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/trainer.h"

namespace pa {
namespace {

// The training graph of a config, built as the trainer builds it (no training).
Graph trainingGraph(const std::string& name, bool noFuse, const std::string& precision = "fp32") {
  const Config cfg =
      loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml", {"data.samples=64", "precision=" + precision});
  DataSplit data = loadData(cfg.data, cfg.seed, std::string(PA_SOURCE_DIR) + "/configs");
  RunOptions opt;
  opt.noFuse = noFuse;
  return compileTrainingGraph(cfg, opt, data.train.xShape, data.train.yShape, cfg.train.batchSize).model.graph;
}

struct GraphCase {
  std::string config;
  bool noFuse;
  std::string precision = "fp32";
};

class GeneratedKernels : public ::testing::TestWithParam<GraphCase> {};

// All of a graph's own kernels go through NVRTC as one program per architecture (each kernel
// has its own extern "C" name); the FlashAttention instantiations are compiled one by one by
// flash_nvrtc_tests, which covers every instantiation the launcher can choose.
TEST_P(GeneratedKernels, CompileWithNvrtcForSm80AndSm90) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  const Graph g = trainingGraph(GetParam().config, GetParam().noFuse, GetParam().precision);
  int kernels = 0;
  for (const char* arch : {"sm_80", "sm_90", "sm_90a"}) {  // sm_90a: what the runner uses on an H100
    codegen::EmitOptions opt;
    opt.wgmma = std::string(arch) == "sm_90a";  // as the runner sets it: bf16 GEMMs on wgmma
    std::string program;
    kernels = 0;
    for (NodeId id : g.topoOrder()) {
      const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
      if (nk.external) continue;
      for (const codegen::Kernel& k : nk.kernels) {
        program += k.source + "\n";
        ++kernels;
      }
    }
    ASSERT_GT(kernels, 0);
    codegen::CompileRequest req;
    req.kernelName = GetParam().config + (GetParam().noFuse ? "_unfused_" : "_fused_") + GetParam().precision;
    req.source = program;
    req.headers = codegen::embeddedKernelHeaders();
    req.arch = arch;
    codegen::CompileResult r;
    ASSERT_NO_THROW(r = nvrtc.compile(req)) << req.kernelName << " " << arch;
    EXPECT_FALSE(r.cubin.empty()) << arch;
  }
  RecordProperty("kernels", kernels);
}

INSTANTIATE_TEST_SUITE_P(Configs, GeneratedKernels,
                         ::testing::Values(GraphCase{"sine_mlp", false}, GraphCase{"sine_mlp", true},
                                           GraphCase{"sine_attention", false}, GraphCase{"sine_attention", true},
                                           GraphCase{"function_mlp", false}, GraphCase{"function_mlp", true},
                                           GraphCase{"mlp_tiny", false}, GraphCase{"mlp_tiny", true},
                                           GraphCase{"mlp_wide", false}, GraphCase{"mlp_wide", true},
                                           GraphCase{"attn_block", false}, GraphCase{"attn_block", true},
                                           GraphCase{"sine_mlp", false, "bf16"}, GraphCase{"sine_mlp", true, "bf16"},
                                           GraphCase{"sine_attention", false, "bf16"}, GraphCase{"sine_attention", true, "bf16"},
                                           GraphCase{"function_mlp", false, "bf16"}, GraphCase{"mlp_tiny", false, "bf16"},
                                           GraphCase{"mlp_wide", false, "bf16"}, GraphCase{"attn_block", false, "bf16"},
                                           GraphCase{"attn_block", true, "bf16"}),
                         [](const ::testing::TestParamInfo<GraphCase>& i) {
                           return i.param.config + (i.param.noFuse ? "_unfused" : "_fused") +
                                  (i.param.precision == "fp32" ? "" : "_" + i.param.precision);
                         });

TEST(Codegen, EveryOpOfTheTrainingGraphsHasKernelsExceptLeaves) {
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

// The forward, dK/dV and dQ kernels the FlashAttention nodes of `g` emit (not the preprocess and
// reduce kernels, which have no wgmma or TF32 form).
std::vector<codegen::Kernel> flashProductKernels(const Graph& g, const codegen::EmitOptions& opt) {
  std::vector<codegen::Kernel> out;
  for (NodeId id : g.topoOrder()) {
    const OpKind op = g.node(id).op;
    if (op != OpKind::FlashAttention && op != OpKind::FlashAttentionGrad) continue;
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      if (k.name.find("_fwd_") != std::string::npos || k.name.find("_dkdv_") != std::string::npos ||
          k.name.find("_dq_") != std::string::npos)
        out.push_back(k);
  }
  return out;
}

// --dump-kernels on an H100 writes what the launcher runs there: the FlashAttention nodes of a bf16
// graph (attn_block: head dim 64) emit the wgmma instantiations for sm_90a targets only.
TEST(Codegen, FlashNodesEmitTheLaunchersWgmmaChoiceOnSm90a) {
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
TEST(Codegen, Tf32PutsFp32AttentionOnTensorCores) {
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

TEST(Codegen, SourceIsByteIdenticalRunToRun) {
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

TEST(Codegen, DumpedKernelsAreSelfContained) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  const Graph g = trainingGraph("sine_attention", true);  // unfused: it has attention-mask kernels
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pa_dump_" + std::to_string(::getpid()));
  const int n = codegen::dumpKernels(g, dir.string());
  EXPECT_GT(n, 10);
  // Without any embedded header available, the mask kernel still compiles: its header is inline.
  bool sawMask = false;
  for (NodeId id : g.topoOrder()) {
    for (const codegen::Kernel& k : codegen::emitNode(g, id).kernels) {
      if (k.headers.empty()) continue;
      sawMask = true;
      const std::string src = codegen::selfContainedSource(k);
      EXPECT_EQ(src.find("#include \"kernels/"), std::string::npos);
      EXPECT_TRUE(std::filesystem::exists(dir / (k.name + ".cu")));
      codegen::CompileRequest req;
      req.kernelName = k.name;
      req.source = src;
      req.arch = "sm_90";
      EXPECT_NO_THROW(nvrtc.compile(req)) << k.name;
    }
  }
  EXPECT_TRUE(sawMask);
  std::filesystem::remove_all(dir);
}

// bf16 kernels include kernels/storage.cuh (or a kernels/gemm_*.cuh, which includes it): one kernel
// of each op of the bf16 graphs compiles on its own with the header pasted in.
TEST(Codegen, DumpedBf16KernelsAreSelfContained) {
  const codegen::Nvrtc& nvrtc = codegen::Nvrtc::instance();
  if (!nvrtc.available()) GTEST_SKIP() << "NVRTC not found: " << nvrtc.unavailableReason();
  int compiled = 0;
  for (bool noFuse : {false, true}) {
    const Graph g = trainingGraph(noFuse ? "sine_attention" : "attn_block", noFuse, "bf16");
    std::set<OpKind> seen;
    for (NodeId id : g.topoOrder()) {
      const codegen::NodeKernels nk = codegen::emitNode(g, id);
      if (nk.external || nk.kernels.empty() || !seen.insert(g.node(id).op).second) continue;
      for (const codegen::Kernel& k : nk.kernels) {
        const std::string src = codegen::selfContainedSource(k);
        EXPECT_EQ(src.find("#include \"kernels/"), std::string::npos) << k.name;
        codegen::CompileRequest req;
        req.kernelName = k.name;
        req.source = src;
        req.arch = "sm_90";
        EXPECT_NO_THROW(nvrtc.compile(req)) << k.name;
        ++compiled;
      }
    }
  }
  EXPECT_GT(compiled, 10);
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

}  // namespace
}  // namespace pa
