// Metrics writer. JSON through nlohmann-json so strings and numbers are always valid JSON.
#include "frontend/metrics.h"

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace pa {

namespace {
bool endsWith(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) {
  if (endsWith(path, ".csv")) csv_ = true;
  else if (endsWith(path, ".jsonl") || endsWith(path, ".json")) csv_ = false;
  else throw UserError("--metrics " + path + ": use a .csv, .jsonl or .json file name");
  out_.open(path);
  if (!out_) throw UserError("--metrics " + path + ": cannot open the file for writing");
  out_.precision(9);
  if (csv_) out_ << "step,loss,val_loss,lr,step_ms\n";
}

void MetricsWriter::write(int64_t step, double loss, double valLoss, double lr, double stepMs) {
  if (csv_) {
    out_ << step << "," << loss << ",";
    if (valLoss >= 0) out_ << valLoss;
    out_ << "," << lr << "," << stepMs << "\n";
  } else {
    nlohmann::json j = {{"step", step}, {"loss", loss}, {"lr", lr}, {"step_ms", stepMs}};
    j["val_loss"] = valLoss >= 0 ? nlohmann::json(valLoss) : nlohmann::json(nullptr);
    out_ << j.dump() << "\n";
  }
  out_.flush();
}

}  // namespace pa
