// Programmatic dependent launch without a GPU (CPU suite): every kernel the runtime may launch as a
// programmatic dependent begins with the prologue of kernels/pdl.cuh (generated kernels of every
// config and op case, FlashAttention instantiations, GEMM variants, the training kernels); the
// launch path picks cuLaunchKernelEx with the programmatic attribute only on sm_90+ with a capable
// driver; and our copies of the driver's launch structs have cuda.h's layout.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "codegen/training_kernels.h"
#include "passes/autodiff.h"
#include "passes/fusion.h"
#include "runtime/cuda/launch.h"
#include "tests/gemm_variants.h"
#include "tests/op_cases.h"
#include "tests/test_util.h"
#include "tests/training_graph.h"

// Last: cuda.h's macros rename driver functions (cuMemAlloc to cuMemAlloc_v2, ...), which nothing
// below calls.
#if __has_include(<cuda.h>)
#include <cuda.h>
#define PA_TEST_HAVE_CUDA_H 1
#endif

namespace pa {
namespace {

// Every kernel `g` launches on the GPU (FlashAttention's instantiations included: an external
// node lists them), for both GEMM families (wgmma on and off): the ones that lack the prologue.
std::vector<std::string> kernelsWithoutPrologue(const Graph& g, const std::string& label) {
  std::vector<std::string> bad;
  for (bool wgmma : {false, true}) {
    codegen::EmitOptions opt;
    opt.wgmma = wgmma;
    for (NodeId id : g.topoOrder())
      for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
        if (!codegen::beginsWithPdlPrologue(k.source)) bad.push_back(label + "/" + k.name + (wgmma ? " (wgmma)" : ""));
  }
  return bad;
}

TEST(Pdl, EveryConfigsKernelsBeginWithThePrologue) {
  size_t graphs = 0;
  for (const char* name : {"mlp_tiny", "mlp_wide", "function_mlp", "sine_mlp", "sine_attention", "attn_block", "tiny_gpt",
                           "tiny_llama"})
    for (bool noFuse : {false, true})
      for (const char* precision : {"fp32", "bf16"}) {
        const std::string label = std::string(name) + (noFuse ? " unfused " : " ") + precision;
        for (const std::string& k : kernelsWithoutPrologue(test::trainingGraph(name, noFuse, precision), label))
          ADD_FAILURE() << k << " does not begin with pa::pdlBegin()";
        ++graphs;
      }
  EXPECT_EQ(graphs, 32u);
}

TEST(Pdl, EveryOpCasesKernelsBeginWithThePrologue) {
  for (const test::OpCase& oc : test::allCases())
    for (bool bf16 : {false, true}) {
      const Graph g = test::opCaseTrainingGraph(oc, bf16);
      for (const std::string& k : kernelsWithoutPrologue(g, oc.name + (bf16 ? "_bf16" : "")))
        ADD_FAILURE() << k << " does not begin with pa::pdlBegin()";
    }
}

// The GEMM tile variants the autotuner measures, the kernels around a cuBLASLt product, and the
// wgmma kernels: all launched by the runner in its mode.
TEST(Pdl, EveryGemmVariantBeginsWithThePrologue) {
  size_t n = 0;
  for (const auto& variants : {gemmtest::allVariants(), gemmtest::libraryEpilogues(), gemmtest::wgmmaVariants()})
    for (const gemmtest::Variant& v : variants) {
      EXPECT_TRUE(codegen::beginsWithPdlPrologue(v.kernel.source)) << v.name;
      ++n;
    }
  EXPECT_GT(n, 50u);
}

TEST(Pdl, TrainingKernelsBeginWithThePrologue) {
  const std::string src = codegen::trainingKernelsSource();
  EXPECT_TRUE(codegen::beginsWithPdlPrologue(src));
  EXPECT_NE(src.find("#include \"kernels/pdl.cuh\""), std::string::npos);
}

TEST(Pdl, PrologueCheckNeedsItFirstInEveryKernel) {
  const std::string good = "extern \"C\" __global__ void a(float* p) {\n  pa::pdlBegin();\n  p[0] = 1;\n}\n";
  const std::string late = "extern \"C\" __global__ void b(float* p) {\n  p[0] = 1;\n  pa::pdlBegin();\n}\n";
  EXPECT_TRUE(codegen::beginsWithPdlPrologue(good));
  EXPECT_FALSE(codegen::beginsWithPdlPrologue(late));
  EXPECT_FALSE(codegen::beginsWithPdlPrologue(good + late));  // one kernel without it is enough
  EXPECT_FALSE(codegen::beginsWithPdlPrologue("__device__ void f() { pa::pdlBegin(); }"));  // no kernel at all
}

TEST(Pdl, LaunchIsProgrammaticOnlyOnSm90WithACapableDriver) {
  using cuda::LaunchMode;
  const int cuda123 = 12030, cuda122 = 12020;
  EXPECT_EQ(cuda::chooseLaunchMode(true, 9, cuda123, true), LaunchMode::Programmatic);   // H100, H200
  EXPECT_EQ(cuda::chooseLaunchMode(true, 10, 12080, true), LaunchMode::Programmatic);    // Blackwell
  EXPECT_EQ(cuda::chooseLaunchMode(false, 9, cuda123, true), LaunchMode::Plain);         // turned off (--no-pdl)
  EXPECT_EQ(cuda::chooseLaunchMode(true, 8, cuda123, true), LaunchMode::Plain);          // A100: no griddepcontrol
  EXPECT_EQ(cuda::chooseLaunchMode(true, 9, cuda123, false), LaunchMode::Plain);         // no cuLaunchKernelEx
  EXPECT_EQ(cuda::chooseLaunchMode(true, 9, cuda122, true), LaunchMode::Plain);          // capture loses the edge
  EXPECT_EQ(cuda::chooseLaunchMode(true, 9, 0, true), LaunchMode::Plain);                // version unknown
}

TEST(Pdl, ProgrammaticLaunchConfigCarriesTheSerializationAttribute) {
  cuda::LaunchShape shape;
  shape.grid = {7, 3, 2};
  shape.block = {256, 1, 1};
  shape.sharedBytes = 1234;
  cuda::CUstream stream = reinterpret_cast<cuda::CUstream>(0x10);
  cuda::CUlaunchAttribute attr;
  const cuda::CUlaunchConfig p = cuda::launchConfig(shape, stream, cuda::LaunchMode::Programmatic, &attr);
  EXPECT_EQ(p.gridDimX, 7u);
  EXPECT_EQ(p.gridDimY, 3u);
  EXPECT_EQ(p.gridDimZ, 2u);
  EXPECT_EQ(p.blockDimX, 256u);
  EXPECT_EQ(p.blockDimY, 1u);
  EXPECT_EQ(p.blockDimZ, 1u);
  EXPECT_EQ(p.sharedMemBytes, 1234u);
  EXPECT_EQ(p.hStream, stream);
  ASSERT_EQ(p.numAttrs, 1u);
  ASSERT_EQ(p.attrs, &attr);
  EXPECT_EQ(attr.id, 6);  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
  EXPECT_EQ(attr.value.programmaticStreamSerializationAllowed, 1);
  const cuda::CUlaunchConfig plain = cuda::launchConfig(shape, stream, cuda::LaunchMode::Plain, &attr);
  EXPECT_EQ(plain.numAttrs, 0u);
  EXPECT_EQ(plain.attrs, nullptr);
}

#ifdef PA_TEST_HAVE_CUDA_H
// The driver reads these structs through the pointer we hand it: every member where cuda.h puts it.
static_assert(sizeof(cuda::CUlaunchAttribute) == sizeof(::CUlaunchAttribute), "CUlaunchAttribute size");
static_assert(alignof(cuda::CUlaunchAttribute) == alignof(::CUlaunchAttribute), "CUlaunchAttribute alignment");
static_assert(offsetof(cuda::CUlaunchAttribute, id) == offsetof(::CUlaunchAttribute, id), "CUlaunchAttribute::id");
static_assert(offsetof(cuda::CUlaunchAttribute, value) == offsetof(::CUlaunchAttribute, value), "CUlaunchAttribute::value");
static_assert(sizeof(cuda::CUlaunchAttribute::value) == sizeof(::CUlaunchAttributeValue), "CUlaunchAttributeValue size");
static_assert(sizeof(cuda::CUlaunchConfig) == sizeof(::CUlaunchConfig), "CUlaunchConfig size");
static_assert(alignof(cuda::CUlaunchConfig) == alignof(::CUlaunchConfig), "CUlaunchConfig alignment");
#define PA_SAME_OFFSET(m) static_assert(offsetof(cuda::CUlaunchConfig, m) == offsetof(::CUlaunchConfig, m), "CUlaunchConfig::" #m)
PA_SAME_OFFSET(gridDimX);
PA_SAME_OFFSET(gridDimY);
PA_SAME_OFFSET(gridDimZ);
PA_SAME_OFFSET(blockDimX);
PA_SAME_OFFSET(blockDimY);
PA_SAME_OFFSET(blockDimZ);
PA_SAME_OFFSET(sharedMemBytes);
PA_SAME_OFFSET(hStream);
PA_SAME_OFFSET(attrs);
PA_SAME_OFFSET(numAttrs);
#undef PA_SAME_OFFSET
static_assert(cuda::kLaunchAttrProgrammaticStreamSerialization == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
              "attribute id");

TEST(Pdl, LaunchStructsHaveCudaHsLayout) {
  // The static_asserts above are the test; this records that they were compiled against cuda.h.
  ::CUlaunchAttributeValue v{};
  v.programmaticStreamSerializationAllowed = 1;
  cuda::CUlaunchAttribute ours{};
  ours.value.programmaticStreamSerializationAllowed = 1;
  EXPECT_EQ(std::memcmp(&v, &ours.value, sizeof v), 0);
}
#else
TEST(Pdl, LaunchStructsHaveCudaHsLayout) { GTEST_SKIP() << "cuda.h not found: the layout is not compared"; }
#endif

}  // namespace
}  // namespace pa
