// `predict`: the fused forward graph of a config with trained weights, over the rows of a CSV
// file or of the config's own data, written as a CSV of predictions (README "Save, resume,
// predict").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "runtime/cuda/cuda_device.h"

namespace pa {

struct PredictOptions {
  std::string configPath;         // --config; "" takes the config the weights' checkpoint holds
  std::vector<std::string> sets;  // --set key.path=value
  std::string weights;            // --weights: a safetensors file, a checkpoint folder, or a folder of them
  std::string input;              // --input CSV
  std::string split;              // --split validation | train | all (the config's data)
  std::string output;             // --output CSV
  std::string device;             // --device auto | cpu | cuda ("" = the config's)
  int64_t batch = 0;              // --batch: rows per forward pass; 0 = train.batch_size
};

// Predictions for `rows` rows of `x` (each the numel of `sampleX` values) with the weights
// `params` (every parameter of the model by name), `device` a resolveDevice() answer: the
// validation graph of a training run for min(train.batch_size, rows) rows a batch (the last
// batch padded with zero rows). `y`, when not null, holds the targets (the graph's loss reads
// them; zeros otherwise). Returns rows × numel(sampleY) values. `predict` and the Python
// module's Model.predict both run it.
std::vector<float> predictRows(const Config& cfg, const std::vector<int64_t>& sampleX, const std::vector<int64_t>& sampleY,
                               const std::map<std::string, std::vector<double>>& params, const std::string& device,
                               int64_t batch, const float* x, const float* y, int64_t rows);

// predictRows for rows in CUDA memory, on the GPU (the device "cuda" resolves to): `x` is the
// device address of rows × numel(sampleX) float32 values on that device, read through
// device-to-device copies after all work queued on the device has finished
// (Predictor::runOnDevice); the batches and kernels are predictRows's, so the values equal its
// "cuda" answer bit for bit. Returns a new device allocation of rows × numel(sampleY) float32
// predictions (none for 0 rows), complete when this returns. Throws UserError when `x` is not
// that many bytes of memory of the device (predictDeviceOrdinal()).
cuda::DeviceBuffer predictRowsOnDevice(const Config& cfg, const std::vector<int64_t>& sampleX,
                                       const std::vector<int64_t>& sampleY,
                                       const std::map<std::string, std::vector<double>>& params, int64_t batch,
                                       cuda::CUdeviceptr x, int64_t rows);

// The ordinal of the CUDA device predictions and training run on (its primary context made
// current). Throws cuda::CudaError where there is none.
int predictDeviceOrdinal();

struct PredictResult {
  int64_t rows = 0;
  double mse = -1;  // over every target value when the input has targets, else -1
  std::string device;
};

// Throws UserError for mistakes in the flags, the config, the weights or the input file.
PredictResult predict(const PredictOptions& opt);

}  // namespace pa
