// Built-in datasets (sine windows, analytic functions) and CSV files, split for validation.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
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

// A CSV file of numbers: the header's names (column0, column1, ... without one) and the rows.
struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<double>> rows;
  bool empty = false;  // the file has no line at all
};
// Reads `in` (the file `path`): every row as long as the header, every cell a finite number
// within float32. Throws UserError "<path>:<line>:<col>: <problem><suffix>", also for a file with
// lines but no data row.
CsvTable readCsvTable(std::istream& in, const std::string& path, bool hasHeader, const std::string& suffix);

// The split's counts and one sample's shapes of a generated dataset (sine, function), known from
// the config alone; nullopt for data read from a file or given (csv, arrays). Throws UserError
// for a dataset too large or a split that leaves no training sample, as loadData does.
struct DataShape {
  std::vector<int64_t> xShape, yShape;
  int64_t trainCount = 0, validationCount = 0;
  std::string description;  // DataSplit's
};
std::optional<DataShape> generatedDataShape(const DataConfig& cfg);

// Builds the data of `cfg` with the run's seed; CSV paths are relative to `baseDir`.
// Throws UserError for a missing or unreadable file, non-numeric cells, NaN, values beyond
// float32, unknown columns: located at the CSV cell and at the data.* key of the config.
DataSplit loadData(const DataConfig& cfg, uint64_t seed, const std::string& baseDir);

}  // namespace pa
