// The CUDA graph runner.
#include "runtime/cuda_graph_runner.h"

#include "codegen/embedded_kernels.h"
#include "codegen/emit.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "passes/memory_plan.h"

namespace pa {

struct CudaGraphRunner::Launch {
  cuda::CUfunction fn = nullptr;
  codegen::Kernel kernel;
};

CudaGraphRunner::CudaGraphRunner(const Graph& g, const cuda::Device& device)
    : g_(g), device_(device), order_(g.topoOrder()) {
  device_.makeCurrent();
  const MemoryPlan plan = planMemory(g);
  offset_ = plan.offset;
  arenaBytes_ = static_cast<size_t>(plan.arenaElements) * sizeof(float);
  arena_ = cuda::DeviceBuffer(std::max<size_t>(arenaBytes_, 16));
  for (ValueId p : g.params()) own_.emplace(p, cuda::DeviceBuffer(std::max<size_t>(numel(g.shape(p)) * sizeof(float), 16)));

  // One NVRTC program holds every generated kernel of the graph.
  launches_.resize(g.numNodes());
  std::string program;
  for (NodeId id : order_) {
    codegen::NodeKernels nk = codegen::emitNode(g, id);
    const Node& n = g.node(id);
    if (nk.external) {
      if (!flash_) flash_ = std::make_unique<FlashAttention>(device_);
      const FlashAttentionConfig cfg = codegen::flashConfigOf(g, n);
      flash_->validate(cfg, n.op == OpKind::FlashAttentionGrad);
      if (n.op == OpKind::FlashAttentionGrad) scratch_.emplace(id, cuda::DeviceBuffer(std::max<size_t>(flash_->backwardWorkspaceBytes(cfg), 16)));
      continue;
    }
    for (codegen::Kernel& k : nk.kernels) {
      program += k.source + "\n";
      launches_[static_cast<size_t>(id)].push_back(Launch{nullptr, std::move(k)});
      ++kernelCount_;
    }
  }
  if (kernelCount_ > 0) {
    codegen::CompileRequest req;
    req.kernelName = "graph";
    req.source = program;
    req.headers = codegen::embeddedKernelHeaders();
    req.arch = device_.info().arch();
    req.extraOptions = {"-lineinfo"};
    const codegen::CompileResult r = codegen::KernelCache::instance().compile(req);
    PA_CU_CHECK(cuModuleLoadData(&module_, r.cubin.data()));
    for (auto& node : launches_)
      for (Launch& l : node) PA_CU_CHECK(cuModuleGetFunction(&l.fn, module_, l.kernel.name.c_str()));
  }
  // Constants are uploaded once; their arena ranges are pinned for the whole run.
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::Constant) continue;
    const int64_t count = numel(g.shape(n.outputs[0]));
    std::vector<float> host(static_cast<size_t>(count), static_cast<float>(n.attrs.getFloat("value", 0.0)));
    if (n.attrs.has("data")) {
      const std::vector<double> d = n.attrs.getDoubles("data");
      std::copy(d.begin(), d.end(), host.begin());
    }
    upload(n.outputs[0], host.data());
  }
}

CudaGraphRunner::~CudaGraphRunner() {
  if (module_) cuda::Driver::instance().api().cuModuleUnload(module_);
}

cuda::CUdeviceptr CudaGraphRunner::ptr(ValueId v) const {
  auto it = own_.find(v);
  if (it != own_.end()) return it->second.ptr();
  return arena_.ptr() + static_cast<cuda::CUdeviceptr>(offset_[static_cast<size_t>(v)]) * sizeof(float);
}

void CudaGraphRunner::upload(ValueId v, const float* host) {
  PA_CU_CHECK(cuMemcpyHtoD(ptr(v), host, static_cast<size_t>(numel(g_.shape(v))) * sizeof(float)));
}

void CudaGraphRunner::download(ValueId v, float* host) const {
  PA_CU_CHECK(cuCtxSynchronize());
  PA_CU_CHECK(cuMemcpyDtoH(host, ptr(v), static_cast<size_t>(numel(g_.shape(v))) * sizeof(float)));
}

void CudaGraphRunner::run(cuda::CUstream stream) {
  for (NodeId id : order_) {
    const Node& n = g_.node(id);
    if (n.op == OpKind::FlashAttention || n.op == OpKind::FlashAttentionGrad) {
      const FlashAttentionConfig cfg = codegen::flashConfigOf(g_, n);
      const Shape& q = g_.shape(n.inputs[0]);
      const Shape& k = g_.shape(n.inputs[1]);
      auto qt = [&](ValueId v) { return FlashTensor::contiguous(ptr(v), static_cast<int>(q[1]), static_cast<int>(q[2]), static_cast<int>(q[3])); };
      auto kt = [&](ValueId v) { return FlashTensor::contiguous(ptr(v), static_cast<int>(k[1]), static_cast<int>(k[2]), static_cast<int>(k[3])); };
      if (n.op == OpKind::FlashAttention) {
        FlashForwardArgs a;
        a.q = qt(n.inputs[0]);
        a.k = kt(n.inputs[1]);
        a.v = kt(n.inputs[2]);
        a.o = qt(n.outputs[0]);
        a.lse = ptr(n.outputs[1]);
        if (cfg.sinkLogits) a.sinkLogits = ptr(n.inputs[3]);
        flash_->forward(cfg, a, stream);
      } else {
        FlashBackwardArgs a;
        a.q = qt(n.inputs[0]);
        a.k = kt(n.inputs[1]);
        a.v = kt(n.inputs[2]);
        a.o = qt(n.inputs[3]);
        a.lse = ptr(n.inputs[4]);
        a.dO = qt(n.inputs[5]);
        a.dQ = qt(n.outputs[0]);
        a.dK = kt(n.outputs[1]);
        a.dV = kt(n.outputs[2]);
        if (cfg.sinkLogits) {
          a.sinkLogits = ptr(n.inputs[6]);
          a.dSinkLogits = ptr(n.outputs[3]);
        }
        a.workspace = scratch_.at(id).ptr();
        flash_->backward(cfg, a, stream);
      }
      continue;
    }
    for (Launch& l : launches_[static_cast<size_t>(id)]) {
      std::vector<cuda::CUdeviceptr> ptrs;
      for (const codegen::KernelArg& a : l.kernel.args) {
        switch (a.kind) {
        case codegen::KernelArg::Input: ptrs.push_back(ptr(n.inputs[static_cast<size_t>(a.index)])); break;
        case codegen::KernelArg::Output: ptrs.push_back(ptr(n.outputs[static_cast<size_t>(a.index)])); break;
        case codegen::KernelArg::Scratch: ptrs.push_back(scratch_.at(id).ptr()); break;
        }
      }
      std::vector<void*> params;
      for (cuda::CUdeviceptr& p : ptrs) params.push_back(&p);
      PA_CU_CHECK(cuLaunchKernel(l.fn, l.kernel.grid[0], l.kernel.grid[1], l.kernel.grid[2], l.kernel.block[0],
                                 l.kernel.block[1], l.kernel.block[2], l.kernel.sharedBytes, stream, params.data(), nullptr));
    }
  }
}

CudaModule::CudaModule(const std::string& source, const cuda::Device& device) {
  device.makeCurrent();
  codegen::CompileRequest req;
  req.kernelName = "module";
  req.source = source;
  req.arch = device.info().arch();
  const codegen::CompileResult r = codegen::KernelCache::instance().compile(req);
  PA_CU_CHECK(cuModuleLoadData(&module_, r.cubin.data()));
}

CudaModule::~CudaModule() {
  if (module_) cuda::Driver::instance().api().cuModuleUnload(module_);
}

cuda::CUfunction CudaModule::function(const char* name) const {
  cuda::CUfunction f = nullptr;
  PA_CU_CHECK(cuModuleGetFunction(&f, module_, name));
  return f;
}

void CudaModule::launch(cuda::CUfunction fn, int64_t work, void** args, cuda::CUstream stream) {
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + 255) / 256, 65535 * 8)));
  PA_CU_CHECK(cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
}

}  // namespace pa
