// Built-in datasets (sine windows, analytic functions) and CSV files, split for validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "frontend/config.h"

namespace pa {

struct Dataset {
  std::vector<int64_t> xShape, yShape;  // one sample's shapes
  std::vector<float> x, y;              // count samples, row-major
  int64_t count = 0;
  int64_t xSize() const;
  int64_t ySize() const;
};

struct DataSplit {
  Dataset train, validation;
  std::string description;  // one line for the run's header
};

// Builds the data of `cfg` with the run's seed; CSV paths are relative to `baseDir`.
// Throws UserError for a missing or unreadable file, non-numeric cells, NaN, values beyond
// float32, unknown columns: located at the CSV cell and at the data.* key of the config.
DataSplit loadData(const DataConfig& cfg, uint64_t seed, const std::string& baseDir);

}  // namespace pa
