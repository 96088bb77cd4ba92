// The CPU and CUDA predictors: CpuExecutor or CudaGraphRunner over a forward graph.
#include "runtime/predictor.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <utility>

#include "runtime/cpu_executor.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/cuda_session.h"

namespace pa {

void Predictor::runOnDevice(cuda::CUdeviceptr, cuda::CUdeviceptr, int64_t) {
  throw std::logic_error("Predictor::runOnDevice: this predictor runs on the CPU");
}

namespace {

template <class T>
class CpuPredictor final : public Predictor {
public:
  CpuPredictor(Graph g, ValueId x, ValueId y, const std::map<std::string, std::vector<double>>& params)
      : g_(std::move(g)), x_(x), y_(y), prediction_(g_.output("prediction")) {
    exec_ = std::make_unique<CpuExecutor<T>>(g_);
    values_.reserve(g_.params().size());
    for (ValueId p : g_.params()) {
      const std::vector<double>& v = params.at(g_.value(p).name);
      values_.emplace_back(v.begin(), v.end());
      exec_->bind(p, values_.back().data());
    }
  }
  void run(const float* x, const float* y, float* prediction) override {
    std::copy(x, x + numel(g_.shape(x_)), exec_->data(x_));
    std::copy(y, y + numel(g_.shape(y_)), exec_->data(y_));
    exec_->run();
    const T* p = exec_->data(prediction_);
    std::copy(p, p + numel(g_.shape(prediction_)), prediction);
  }

private:
  Graph g_;
  ValueId x_, y_, prediction_;
  std::unique_ptr<CpuExecutor<T>> exec_;
  std::vector<std::vector<T>> values_;  // the parameters, bound by address: never resized after binding
};

class CudaPredictor final : public Predictor {
public:
  CudaPredictor(Graph g, ValueId x, ValueId y, Precision precision, GemmProvider gemm,
                const std::map<std::string, std::vector<double>>& params)
      : g_(std::move(g)), x_(x), y_(y), prediction_(g_.output("prediction")) {
    cuda::Device& device = cudaDevice0();
    device.makeCurrent();
    stream_ = std::make_unique<cuda::Stream>();
    CudaRunnerOptions opt;
    opt.tf32 = precision == Precision::Tf32;
    opt.gemm = gemm;
    runner_ = std::make_unique<CudaGraphRunner>(g_, device, opt);
    for (ValueId p : g_.params()) {
      const std::vector<double>& v = params.at(g_.value(p).name);
      const std::vector<float> f(v.begin(), v.end());
      runner_->upload(p, f.data());
    }
  }
  void run(const float* x, const float* y, float* prediction) override {
    runner_->upload(x_, x);
    runner_->upload(y_, y);
    runner_->run(stream_->get());
    stream_->synchronize();
    runner_->download(prediction_, prediction);
  }

  void runOnDevice(cuda::CUdeviceptr x, cuda::CUdeviceptr prediction, int64_t rows) override {
    // lower-bf16 keeps inputs and graph outputs fp32, so every copy below is of float32 bits.
    assert(g_.value(x_).type.dtype == DType::F32 && g_.value(y_).type.dtype == DType::F32 &&
           g_.value(prediction_).type.dtype == DType::F32 && "inputs and the prediction are fp32 in every precision");
    const Shape& xs = g_.shape(x_);
    const int64_t batch = xs.empty() ? 1 : xs[0];
    const int64_t features = numel(xs) / batch, targets = numel(g_.shape(prediction_)) / batch;
    const cuda::CUstream s = stream_->get();
    const cuda::CUdeviceptr xb = runner_->devicePtr(x_), yb = runner_->devicePtr(y_), pb = runner_->devicePtr(prediction_);
    constexpr size_t kFloat = sizeof(float);
    cudaDevice0().makeCurrent();
    PA_CU_CHECK(cuCtxSynchronize());
    for (int64_t at = 0; at < rows; at += batch) {
      const size_t n = static_cast<size_t>(std::min(batch, rows - at));
      const size_t xRow = static_cast<size_t>(features), yRow = static_cast<size_t>(targets);
      const size_t pad = static_cast<size_t>(batch) - n;
      PA_CU_CHECK(cuMemcpyDtoDAsync(xb, x + static_cast<size_t>(at) * xRow * kFloat, n * xRow * kFloat, s));
      if (pad > 0) PA_CU_CHECK(cuMemsetD32Async(xb + n * xRow * kFloat, 0u, pad * xRow, s));
      PA_CU_CHECK(cuMemsetD32Async(yb, 0u, static_cast<size_t>(batch) * yRow, s));
      runner_->run(s);
      PA_CU_CHECK(cuMemcpyDtoDAsync(prediction + static_cast<size_t>(at) * yRow * kFloat, pb, n * yRow * kFloat, s));
    }
    stream_->synchronize();
  }

private:
  Graph g_;
  ValueId x_, y_, prediction_;
  std::unique_ptr<cuda::Stream> stream_;
  std::unique_ptr<CudaGraphRunner> runner_;
};

}  // namespace

std::unique_ptr<Predictor> makeCpuPredictor(Graph g, ValueId x, ValueId y, Precision precision,
                                            const std::map<std::string, std::vector<double>>& params) {
  switch (precision) {
  case Precision::Fp64: return std::make_unique<CpuPredictor<double>>(std::move(g), x, y, params);
  case Precision::Fp32:
  case Precision::Tf32:
  case Precision::Bf16: return std::make_unique<CpuPredictor<float>>(std::move(g), x, y, params);
  }
  return nullptr;
}

std::unique_ptr<Predictor> makeCudaPredictor(Graph g, ValueId x, ValueId y, Precision precision, GemmProvider gemm,
                                             const std::map<std::string, std::vector<double>>& params) {
  return std::make_unique<CudaPredictor>(std::move(g), x, y, precision, gemm, params);
}

}  // namespace pa
