// Per-step metrics to a CSV or JSON Lines file (chosen by the file's extension).
#pragma once

#include <fstream>
#include <string>

namespace pa {

class MetricsWriter {
public:
  // ".csv" writes CSV with a header; ".jsonl" or ".json" write one JSON object per line.
  // Throws UserError when the file cannot be opened or the extension is unknown.
  explicit MetricsWriter(const std::string& path);
  // `valLoss` < 0 when no validation ran at this step.
  void write(int64_t step, double loss, double valLoss, double lr, double stepMs);

private:
  std::ofstream out_;
  bool csv_ = true;
};

}  // namespace pa
