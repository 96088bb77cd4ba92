// One MatMul or FusedLinear node on the GPU with chosen emit options, and its float64 CPU
// reference: shared by tests/gpu/gemm_gpu_test.cpp and bench/gemm_bench.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "codegen/emit.h"
#include "graph/graph.h"
#include "graph/node_attrs.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/kernel_params.h"

namespace pa::gemmtest {

// A MatMul (a·b with transposes) or a FusedLinear (x·w + bias, activation) node.
struct GemmProblem {
  bool fused = false;
  Shape a, b;                 // MatMul operands, or FusedLinear's x and w
  bool ta = false, tb = false;  // FusedLinear: tb is transpose_w
  std::string act = "none";
  bool bias = false;
  int64_t headDim = 8, ropeDims = 0;  // activation rope: base 100
  // MatMul only: "relu" or "gelu" makes it MatMulActGrad, the product times that activation's
  // derivative at a third input x laid out as the output (a layer's dX: dY·Wᵀ, x its input).
  std::string gradAct;
  // MatMul only: "a" or "b" makes it MatMulBiasGrad, with that operand's sums over K as a second
  // output (a layer's weight and bias gradients).
  std::string biasGrad;
};

// MatMul C[m, n] = op(A)·op(B) with A stored [k, m] when `ta` (else [m, k]) and B stored [n, k]
// when `tb` (else [k, n]).
inline GemmProblem matmulProblem(int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  GemmProblem p;
  p.a = ta ? Shape{k, m} : Shape{m, k};
  p.b = tb ? Shape{n, k} : Shape{k, n};
  p.ta = ta, p.tb = tb;
  return p;
}

// The one-node graph; returns the node's id.
inline NodeId buildGraph(Graph& g, const GemmProblem& p) {
  AttrMap attrs;
  ValueId out;
  if (p.fused) {
    std::vector<ValueId> ins{g.addParam("x", p.a, "xavier"), g.addParam("w", p.b, "xavier")};
    const int64_t units = p.tb ? p.b[0] : p.b[1];
    if (p.bias) ins.push_back(g.addParam("bias", Shape{units}, "zeros"));
    attrs.set<attr::Activation>(p.act);
    attrs.set<attr::TransposeW>(p.tb);
    if (p.act == "rope") attrs.set<attr::HeadDim>(p.headDim).set<attr::RopeDims>(p.ropeDims).set<attr::RopeBase>(100.0);
    out = g.add(OpKind::FusedLinear, ins, attrs);
  } else if (!p.gradAct.empty()) {
    attrs.set<attr::TransposeA>(p.ta);
    attrs.set<attr::TransposeB>(p.tb);
    attrs.set<attr::GradActivation>(p.gradAct);
    const int64_t m = p.ta ? p.a[p.a.size() - 1] : p.a[p.a.size() - 2], n = p.tb ? p.b[p.b.size() - 2] : p.b[p.b.size() - 1];
    Shape xs(p.a.begin(), p.a.end() - 2);
    if (p.b.size() > xs.size() + 2) xs.assign(p.b.begin(), p.b.end() - 2);
    xs.push_back(m), xs.push_back(n);
    out = g.add(OpKind::MatMulActGrad, {g.addParam("a", p.a, "xavier"), g.addParam("b", p.b, "xavier"), g.addParam("x", xs, "xavier")},
                attrs);
  } else {
    attrs.set<attr::TransposeA>(p.ta);
    attrs.set<attr::TransposeB>(p.tb);
    if (!p.biasGrad.empty()) attrs.set<attr::BiasOperand>(p.biasGrad);
    out = g.add(p.biasGrad.empty() ? OpKind::MatMul : OpKind::MatMulBiasGrad, {g.addParam("a", p.a, "xavier"), g.addParam("b", p.b, "xavier")},
                attrs);
  }
  g.setOutput("y", out);
  return g.producer(out).id;
}

// Stores the node's two operands in bf16 (as lower-bf16 does for precision: bf16), and its outputs
// in bf16 or fp32; the bias stays fp32, MatMulActGrad's x is stored as the outputs.
inline void storeOperandsInBf16(Graph& g, NodeId id, bool bf16Outputs) {
  const Node& n = g.node(id);
  g.setStorageTypes();
  g.setDtype(n.inputs[0], DType::BF16);
  g.setDtype(n.inputs[1], DType::BF16);
  if (n.op == OpKind::MatMulActGrad) g.setDtype(n.inputs[2], bf16Outputs ? DType::BF16 : DType::F32);
  for (ValueId v : n.outputs) g.setDtype(v, bf16Outputs ? DType::BF16 : DType::F32);
}

// Uploads `values` to `buf` in storage type `dtype` (bf16: rounded to nearest even) and leaves
// in `values` what the device now holds.
inline void uploadStored(cuda::DeviceBuffer& buf, std::vector<float>& values, DType dtype) {
  if (dtype != DType::BF16) {
    buf.upload(values.data(), values.size() * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(values.size());
  for (size_t j = 0; j < bits.size(); ++j) bits[j] = bf16Bits(values[j]), values[j] = bf16Value(bits[j]);
  buf.upload(bits.data(), bits.size() * sizeof(uint16_t));
}

// Float64 reference of every output of the node (out0, and FusedLinear-GELU's or -SwiGLU's
// pre-activation, or MatMulBiasGrad's operand sums), and for MatMulActGrad the product before the
// derivative after them. Rope
// turns each head's column pairs (c, c + 1), c < dims, of row i by (i mod S)·base^(-c/dims), S
// the second-to-last extent of x.
inline std::vector<std::vector<double>> reference(const Graph& g, NodeId id, const std::vector<std::vector<float>>& in) {
  const Node& n = g.node(id);
  const Shape& a = g.shape(n.inputs[0]);
  const Shape& b = g.shape(n.inputs[1]);
  std::vector<std::vector<double>> out;
  for (ValueId v : n.outputs) out.emplace_back(static_cast<size_t>(numel(g.shape(v))));
  if (n.op == OpKind::MatMulActGrad) out.emplace_back(out[0].size());
  int64_t batch, m, k, nn, strideA, strideB;
  bool ta, tb;
  if (n.op == OpKind::FusedLinear) {
    tb = n.attrs.get<attr::TransposeW>(), ta = false;
    k = a.back(), nn = tb ? b[0] : b[1], m = numel(a) / k, batch = 1, strideA = strideB = 0;
  } else {
    ta = n.attrs.get<attr::TransposeA>(), tb = n.attrs.get<attr::TransposeB>();
    m = ta ? a[a.size() - 1] : a[a.size() - 2], k = ta ? a[a.size() - 2] : a[a.size() - 1];
    nn = tb ? b[b.size() - 2] : b[b.size() - 1];
    batch = numel(g.shape(n.outputs[0])) / (m * nn);
    strideA = a.size() > 2 ? m * k : 0, strideB = b.size() > 2 ? k * nn : 0;
  }
  const std::string act = n.op == OpKind::FusedLinear ? n.attrs.get<attr::Activation>() : "none";
  const std::string gradAct = n.op == OpKind::MatMulActGrad ? n.attrs.get<attr::GradActivation>() : "";
  const bool bias = n.op == OpKind::FusedLinear && n.inputs.size() == 3;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t i = 0; i < m; ++i) {
      const float* A = in[0].data() + bi * strideA;
      const float* B = in[1].data() + bi * strideB;
      std::vector<double> row(static_cast<size_t>(nn), 0.0);
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? A[p * m + i] : A[i * k + p];
        if (tb)
          for (int64_t j = 0; j < nn; ++j) row[j] += x * B[j * k + p];
        else
          for (int64_t j = 0; j < nn; ++j) row[j] += x * B[p * nn + j];
      }
      for (int64_t j = 0; j < nn; ++j) {
        double v = row[j] + (bias ? in[2][j] : 0.0);
        const size_t at = static_cast<size_t>((bi * m + i) * nn + j);
        if (act == "swiglu") {  // out1: the pre-activations; out0: silu(gate)·up of each column pair
          out[1][at] = v;
          if (j % 2 == 1) {
            const double g = out[1][at - 1];
            out[0][at / 2] = g / (1.0 + std::exp(-g)) * v;
          }
          continue;
        }
        if (act == "gelu") {
          out[1][at] = v;
          v = 0.5 * v * (1.0 + std::erf(v * 0.70710678118654752));
        }
        if (act == "relu") v = std::max(v, 0.0);
        if (!gradAct.empty()) {  // dy·relu'(x), dy·gelu'(x) = dy·(Φ(x) + x·φ(x))
          const double x = in[2][at];
          out[1][at] = v;
          v *= gradAct == "relu" ? (x > 0 ? 1.0 : 0.0)
                                 : 0.5 * (1.0 + std::erf(x * 0.70710678118654752)) + x * 0.39894228040143268 * std::exp(-0.5 * x * x);
        }
        out[0][at] = v;
      }
      if (n.op == OpKind::MatMulBiasGrad && n.attrs.get<attr::BiasOperand>() == "a")  // (one product: batch 1)
        for (int64_t p = 0; p < k; ++p) out[1][static_cast<size_t>(i)] += ta ? A[p * m + i] : A[i * k + p];
      if (n.op == OpKind::MatMulBiasGrad && n.attrs.get<attr::BiasOperand>() == "b" && i == 0)
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < nn; ++j) out[1][static_cast<size_t>(j)] += tb ? B[j * k + p] : B[p * nn + j];
      if (act == "rope") {
        double* y = out[0].data() + (bi * m + i) * nn;
        const int64_t hd = n.attrs.get<attr::HeadDim>(), dims = n.attrs.get<attr::RopeDims>() ? n.attrs.get<attr::RopeDims>() : hd;
        const double pos = static_cast<double>(i % a[a.size() - 2]), base = n.attrs.get<attr::RopeBase>();
        for (int64_t c = 0; c < nn; c += 2) {
          if (c % hd >= dims) continue;
          const double angle = pos * std::pow(base, -static_cast<double>(c % hd) / static_cast<double>(dims));
          const double y0 = y[c], y1 = y[c + 1];
          y[c] = y0 * std::cos(angle) - y1 * std::sin(angle);
          y[c + 1] = y0 * std::sin(angle) + y1 * std::cos(angle);
        }
      }
    }
  return out;
}

// The node's generated kernels compiled for the device, with a device buffer per input and output.
class NodeOnGpu {
public:
  NodeOnGpu(const Graph& g, NodeId id, const codegen::EmitOptions& opt, const cuda::Device& device)
      : NodeOnGpu(g, id, codegen::emitNode(g, id, opt), device) {}
  // With kernels emitted (and possibly rewritten, as the benchmark's variant sweep does) elsewhere.
  NodeOnGpu(const Graph& g, NodeId id, codegen::NodeKernels kernels, const cuda::Device& device)
      : node_(g.node(id)), kernels_(std::move(kernels)) {
    for (const codegen::Kernel& k : kernels_.kernels) {
      modules_.push_back(std::make_unique<CudaModule>(codegen::selfContainedSource(k), device));
      functions_.push_back(modules_.back()->function(k.name.c_str()));
      if (k.sharedBytes > 48 * 1024)  // the wgmma kernels' rings
        PA_CU_CHECK(cuFuncSetAttribute(functions_.back(), cuda::kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(k.sharedBytes)));
    }
    for (ValueId v : node_.inputs) inputs.emplace_back(static_cast<size_t>(numel(g.shape(v))) * sizeof(float) + 16);
    for (ValueId v : node_.outputs) outputs.emplace_back(static_cast<size_t>(numel(g.shape(v))) * sizeof(float) + 16);
    scratch = cuda::DeviceBuffer(std::max<size_t>(kernels_.scratchBytes, 16));
    if (kernels_.zeroScratch) scratch.fill32(0);  // as the runner: once (a kernel leaves it as it found it)
  }

  const codegen::NodeKernels& kernels() const { return kernels_; }

  // Launches every kernel on `stream` with the inputs of set `inputs` (see `inputs`).
  void launch(cuda::CUstream stream = nullptr) { launchWith(inputs, stream); }
  void launchWith(const std::vector<cuda::DeviceBuffer>& in, cuda::CUstream stream = nullptr) {
    const std::vector<cuda::KernelParams>& params = paramsFor(in);
    for (size_t i = 0; i < kernels_.kernels.size(); ++i) {
      const codegen::Kernel& k = kernels_.kernels[i];
      PA_CU_CHECK(cuLaunchKernel(functions_[i], k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
                                 k.sharedBytes, stream, params[i].data(), nullptr));
    }
  }

  std::vector<cuda::DeviceBuffer> inputs, outputs;
  cuda::DeviceBuffer scratch;  // the node's scratch (split-K partial sums)

private:
  // Every kernel's parameters for inputs `in`, built once per set of input addresses (tensor maps
  // are encoded on the host: the benchmarks' timed launches then hold only the kernels).
  const std::vector<cuda::KernelParams>& paramsFor(const std::vector<cuda::DeviceBuffer>& in) {
    std::vector<cuda::CUdeviceptr> key;
    for (const cuda::DeviceBuffer& b : in) key.push_back(b.ptr());
    for (const cuda::DeviceBuffer& b : outputs) key.push_back(b.ptr());
    key.push_back(scratch.ptr());
    auto it = params_.find(key);
    if (it != params_.end()) return it->second;
    std::vector<cuda::KernelParams> all;
    for (const codegen::Kernel& k : kernels_.kernels)
      all.push_back(launchParams(
          k, [&](int i) { return in[static_cast<size_t>(i)].ptr(); }, [&](int i) { return outputs[static_cast<size_t>(i)].ptr(); },
          scratch.ptr()));
    return params_.emplace(std::move(key), std::move(all)).first->second;
  }

  const Node& node_;
  codegen::NodeKernels kernels_;
  std::map<std::vector<cuda::CUdeviceptr>, std::vector<cuda::KernelParams>> params_;
  std::vector<std::unique_ptr<CudaModule>> modules_;
  std::vector<cuda::CUfunction> functions_;
};

// Uniform random values in [-1, 1], none exactly zero.
inline std::vector<float> randomValues(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) {
    do x = u(rng);
    while (x == 0.0f);
  }
  return v;
}

}  // namespace pa::gemmtest
