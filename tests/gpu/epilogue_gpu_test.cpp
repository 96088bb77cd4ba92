// The backward epilogue fusions on the GPU: MseLossGrad (the loss and the gradient in one launch)
// and MatMulBiasGrad (the weight gradient with its bias gradient, on the generated kernels and on
// cuBLASLt) against the float64 CPU executor on awkward shapes, with error bounds derived from
// the arithmetic each kernel does, and run to run: the same bits on every replay. Skips without a
// device (label gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "graph/verifier.h"
#include "passes/autodiff.h"
#include "passes/dce.h"
#include "passes/fusion.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda/cublaslt.h"
#include "runtime/cuda_graph_runner.h"
#include "tests/gpu/gpu_test_util.h"
#include "../pass_test_util.h"
#include "../test_util.h"

namespace pa {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24: float32's unit roundoff

// Values in [-1, 1) that float32 holds exactly, so the CPU reference and the GPU read the same.
std::vector<double> floatValues(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  test::fillRandom(v.data(), n, seed);
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

struct Results {
  std::map<std::string, std::vector<float>> gpu;
  std::map<std::string, std::vector<double>> cpu;
};

// Runs `g` once on the CPU in float64 and `runs` times on the GPU (one runner, the step replayed)
// from the same values; returns the GPU's outputs of the last run, after checking that every run
// gave the same bits.
Results runBoth(const Graph& g, const std::map<ValueId, std::vector<double>>& values, const CudaRunnerOptions& opt, int runs = 3) {
  Results r;
  CpuExecutor<double> cpu(g);
  std::map<ValueId, std::vector<double>> keep = values;
  for (auto& [v, data] : keep) {
    if (g.producer(v).op == OpKind::Param) cpu.bind(v, data.data());
    else std::copy(data.begin(), data.end(), cpu.data(v));
  }
  cpu.run();
  for (const auto& [name, v] : g.outputs()) r.cpu[name].assign(cpu.data(v), cpu.data(v) + numel(g.shape(v)));
  CudaGraphRunner gpu(g, test::gpuDevice(), opt);
  for (const auto& [v, data] : values) {
    const std::vector<float> f(data.begin(), data.end());
    gpu.upload(v, f.data());
  }
  for (int i = 0; i < runs; ++i) {
    gpu.run();
    for (const auto& [name, v] : g.outputs()) {
      std::vector<float> got(static_cast<size_t>(numel(g.shape(v))), NAN);
      gpu.download(v, got.data());
      if (i > 0) {
        EXPECT_EQ(std::memcmp(got.data(), r.gpu[name].data(), got.size() * sizeof(float)), 0) << name << ": run " << i << " differs";
      }
      r.gpu[name] = std::move(got);
    }
  }
  return r;
}

using test::applyOne;

// MseLossGrad on sizes around both paths (one block up to 65536 terms, chunks of 4096 with the
// last-block-done sum beyond). Bounds: the gradient is fl(fl(fl(p − t)·fl(2/N))·dy), four
// roundings of relative size ≤ u each against the exact (p − t)·(2/N)·dy, so ≤ 5u·|exact|; the
// loss sums exact float differences squared in double (error ≤ N·2^-53 relative, negligible
// beside u for N < 2^26) and rounds once to float: ≤ 2u relative. New targets on the same runner
// check that the chunk counter was reset (a stale counter would leave the loss unwritten).
TEST(EpilogueOnGpu, MseLossGradMatchesTheFloat64Reference) {
  PA_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {7, 3}, {257, 129}, {509, 129}, {8192, 256}, {8191, 257}};
  for (const auto& [rows, units] : shapes) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(units));
    Graph g;
    const ValueId p = g.addParam("p", {rows, units}, "xavier");
    const ValueId t = g.addInput("target", {rows, units});
    g.setOutput("loss", g.add(OpKind::MseLoss, {p, t}, {}, "loss"));
    appendBackward(g, g.output("loss"), g.params());
    ASSERT_EQ(applyOne(g, makeFuseLossGradPattern()), 1);
    // The same prediction against two targets: each checked on a runner of its own (three
    // replays each, the same bits every time), then both on one runner, one after the other.
    std::vector<double> losses;
    for (uint64_t seed : {1u, 2u}) {
      const std::map<ValueId, std::vector<double>> values = {{p, floatValues(rows * units, 1)},
                                                             {t, floatValues(rows * units, 10 + seed)}};
      const Results r = runBoth(g, values, {});
      const double loss = r.cpu.at("loss")[0];
      losses.push_back(loss);
      EXPECT_LE(std::fabs(r.gpu.at("loss")[0] - loss), 2 * kU * loss) << "loss " << r.gpu.at("loss")[0] << " vs " << loss;
      const std::vector<double>& want = r.cpu.at("grad/p");
      const std::vector<float>& got = r.gpu.at("grad/p");
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += std::fabs(got[i] - want[i]) > 5 * kU * std::fabs(want[i]);
      EXPECT_EQ(bad, 0);
    }
    // A chunk counter left set by the first run would leave the second loss unwritten (stale).
    CudaGraphRunner gpu(g, test::gpuDevice());
    const std::vector<double> pv = floatValues(rows * units, 1);
    gpu.upload(p, std::vector<float>(pv.begin(), pv.end()).data());
    for (int i = 0; i < 2; ++i) {
      const std::vector<double> tv = floatValues(rows * units, 11 + static_cast<uint64_t>(i));
      gpu.upload(t, std::vector<float>(tv.begin(), tv.end()).data());
      gpu.run();
      float loss = NAN;
      gpu.download(g.output("loss"), &loss);
      EXPECT_LE(std::fabs(loss - losses[static_cast<size_t>(i)]), 2 * kU * losses[static_cast<size_t>(i)]) << "run " << i;
    }
  }
}

// MatMulBiasGrad of one linear layer (x [rows, K]; dY the gradient of an MSE on its output), both
// operand sides (transpose_w puts dY in A), on the generated kernels (FP64 where the part runs it
// at full rate, and SIMT) and on cuBLASLt. Bounds: a
// float32 sum of K products is within γ_K = K·u of the exact one relative to Σ|a||b| (Higham's
// bound for recursive summation, which also covers blocked and split sums), plus u for the
// products' own rounding, plus the GPU's dY's own error (its Sub, Scale, Mul: ≤ 4u relative, and
// the forward product's error scaled by 2/N, `slack`): |err| ≤ (K + 8)·u·Σ_k |a_ik||b_kj| + K·slack,
// Σ computed on the CPU. The bias gradient is a sum of K values, bounded alike with Σ|d| (the
// generated column sums add in double and round once; cuBLASLt's BGRAD may add in float).
TEST(EpilogueOnGpu, MatMulBiasGradMatchesTheFloat64ReferenceOnBothProviders) {
  PA_REQUIRE_GPU();
  struct Case {
    int64_t rows, k, units;
    bool tw;
  };
  // (units 1 without transpose_w: the generated weight gradient is a weighted column sum, whole
  // or split into parts: rows 1 and 300, 8191 and 8192 at widths 257 and 256, attn_block's last layer)
  // (rows 5000 and 3001: split products whose tiles overhang both edges, either operand summed)
  const std::vector<Case> cases = {{1, 5, 1, false},     {7, 3, 3, false},       {257, 33, 129, false}, {257, 33, 129, true},
                                   {7, 17, 1, true},     {8192, 64, 129, false}, {8192, 256, 256, true}, {300, 7, 1, false},
                                   {8191, 257, 1, false}, {8192, 256, 1, false}, {5000, 130, 300, false}, {3001, 200, 70, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.k) + "->" + std::to_string(c.units) + (c.tw ? " transpose_w" : ""));
    Graph g;
    const ValueId x = g.addInput("x", {c.rows, c.k});
    const ValueId w = g.addParam("w", c.tw ? Shape{c.units, c.k} : Shape{c.k, c.units}, "xavier");
    const ValueId b = g.addParam("b", {c.units}, "xavier");
    const ValueId y = g.add(OpKind::FusedLinear, {x, w, b}, AttrMap().set<attr::TransposeW>(c.tw));
    const ValueId target = g.addInput("target", {c.rows, c.units});
    g.setOutput("loss", g.add(OpKind::MseLoss, {y, target}, {}, "loss"));
    appendBackward(g, g.output("loss"), g.params());
    ASSERT_EQ(applyOne(g, makeFuseBiasGradPattern()), 1);
    std::map<ValueId, std::vector<double>> values = {{x, floatValues(c.rows * c.k, 3)},
                                                     {w, floatValues(c.k * c.units, 4)},
                                                     {b, floatValues(c.units, 5)},
                                                     {target, floatValues(c.rows * c.units, 6)}};
    // dY = 2/N·(y − target) comes from the GPU's own forward; the bounds use the CPU's dY, whose
    // difference from the GPU's is within the forward's own bound and far below these.
    CpuExecutor<double> ref(g);
    for (auto& [v, data] : values) {
      if (g.producer(v).op == OpKind::Param) ref.bind(v, data.data());
      else std::copy(data.begin(), data.end(), ref.data(v));
    }
    ref.run();
    const ValueId dW = g.output("grad/w");
    const Node& fused = g.producer(dW);
    ASSERT_EQ(fused.op, OpKind::MatMulBiasGrad);
    const ValueId dy = c.tw ? fused.inputs[0] : fused.inputs[1];
    const double* d = ref.data(dy);
    // Σ|x||d| per weight-gradient element, and Σ|d| per column.
    std::vector<double> absW(static_cast<size_t>(c.k * c.units), 0.0), absB(static_cast<size_t>(c.units), 0.0);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t j = 0; j < c.units; ++j) {
        const double dv = std::fabs(d[r * c.units + j]);
        absB[static_cast<size_t>(j)] += dv;
        for (int64_t i = 0; i < c.k; ++i) {
          const size_t at = static_cast<size_t>(c.tw ? j * c.k + i : i * c.units + j);
          absW[at] += std::fabs(values[x][static_cast<size_t>(r * c.k + i)]) * dv;
        }
      }
    // Generated: the default (on full-rate FP64 parts the FP64 kernel, which sums the bias
    // operand inside the product) and the SIMT kernel with SumTo's column sums after it.
    for (int arm = 0; arm < 3; ++arm) {
      const GemmProvider provider = arm == 2 ? GemmProvider::Cublaslt : GemmProvider::Generated;
      if (provider == GemmProvider::Cublaslt && !cuda::CublasLt::instance().available()) continue;
      SCOPED_TRACE(arm == 0 ? "generated" : arm == 1 ? "generated, SIMT" : "cublaslt");
      CudaRunnerOptions opt;
      opt.gemm = provider;
      opt.fp64Gemm = arm != 1;
      const Results r = runBoth(g, values, opt);
      // The forward's error reaches dY: y's K-term sum (≤ (K + 1)·u·Σ|x||w| + |b|·u) times 2/N.
      const double slack = 2.0 / static_cast<double>(c.rows * c.units) * (c.k + 2) * kU * (c.k + 1.0);
      const double K = static_cast<double>(c.rows);
      int bad = 0;
      for (size_t i = 0; i < absW.size(); ++i) {
        const double want = r.cpu.at("grad/w")[i], got = r.gpu.at("grad/w")[i];
        bad += std::fabs(got - want) > (K + 8) * kU * absW[i] + K * slack;
      }
      EXPECT_EQ(bad, 0) << "weight gradient";
      bad = 0;
      for (size_t j = 0; j < absB.size(); ++j) {
        const double want = r.cpu.at("grad/b")[j], got = r.gpu.at("grad/b")[j];
        bad += std::fabs(got - want) > (K + 8) * kU * absB[j] + K * slack;
      }
      EXPECT_EQ(bad, 0) << "bias gradient";
    }
  }
}

}  // namespace
}  // namespace pa
