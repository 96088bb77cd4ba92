// Predictions: a forward graph (inputs "input" and "target", output "prediction") run batch by
// batch on the CPU or a CUDA device, with given parameter values. `predict` drives it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/settings.h"
#include "graph/graph.h"
#include "runtime/cuda/cuda_driver.h"

namespace pa {

class Predictor {
public:
  virtual ~Predictor() = default;
  // Predicts one batch: `x` holds batch × sample-input values, `y` batch × target values (the
  // graph's loss needs them; zeros serve when there are none); writes batch × prediction values.
  virtual void run(const float* x, const float* y, float* prediction) = 0;
  // The device entry (CUDA predictors; the CPU's throws std::logic_error): `rows` rows of
  // float32 inputs at device address `x` to their predictions at device address `prediction`,
  // both row-major in the predictor's device's primary context, batch by batch as predictRows
  // drives run() (the last batch padded with zero rows, the targets zeros), through
  // device-to-device copies into and out of the graph's buffers: no host memory in between.
  // Streams: it waits for all work queued in the context (any stream, PyTorch's included)
  // before it reads `x`, queues its copies and kernels on its own stream, and waits for that
  // stream before it returns, so the predictions are complete then.
  virtual void runOnDevice(cuda::CUdeviceptr x, cuda::CUdeviceptr prediction, int64_t rows);
};

// Both take the graph with its parameters' values by name (every parameter must have one) and
// compile or plan it once. The CPU runs double for precision fp64, float otherwise; the GPU runs
// the kernels `train` would (TF32 with precision tf32, `gemm` choosing the GEMM provider).
std::unique_ptr<Predictor> makeCpuPredictor(Graph g, ValueId x, ValueId y, Precision precision,
                                            const std::map<std::string, std::vector<double>>& params);
std::unique_ptr<Predictor> makeCudaPredictor(Graph g, ValueId x, ValueId y, Precision precision, GemmProvider gemm,
                                             const std::map<std::string, std::vector<double>>& params);

}  // namespace pa
