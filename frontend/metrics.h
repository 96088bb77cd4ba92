// Per-step metrics to a CSV or JSON Lines file (chosen by the file's extension).
#pragma once

#include <fstream>
#include <string>

namespace pa {

class MetricsWriter {
public:
  // ".csv" writes CSV with a header; ".jsonl" or ".json" write one JSON object per line.
  // With `keepThroughStep` >= 0 (a resumed run) an existing file of the same kind is continued:
  // its rows of steps up to that one stay, later ones (steps the resumed checkpoint had not
  // reached) go. Throws UserError when the file cannot be opened or the extension is unknown.
  explicit MetricsWriter(const std::string& path, int64_t keepThroughStep = -1);
  // `valLoss` < 0 when no validation ran at this step.
  void write(int64_t step, double loss, double valLoss, double lr, double stepMs);

private:
  std::ofstream out_;
  bool csv_ = true;
};

}  // namespace pa
