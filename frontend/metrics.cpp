// Metrics writer. JSON through nlohmann-json so strings and numbers are always valid JSON.
#include "frontend/metrics.h"

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "frontend/config_node.h"

namespace pa {

namespace {

bool endsWith(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

constexpr const char* kCsvHeader = "step,loss,val_loss,lr,step_ms";

// The rows of an earlier run's file that a resumed run keeps: those of steps <= `last`, as long
// as the file is of this writer's kind (else none).
std::vector<std::string> keptRows(const std::string& path, bool csv, int64_t last) {
  std::vector<std::string> rows;
  std::ifstream in(path);
  std::string line;
  if (csv && (!std::getline(in, line) || line != kCsvHeader)) return rows;
  while (std::getline(in, line)) {
    int64_t step = -1;
    if (csv) {
      if (!parseCount(line.substr(0, line.find(',')), step)) step = -1;
    } else {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) step = j["step"].get<int64_t>();
    }
    if (step >= 1 && step <= last) rows.push_back(line);
  }
  return rows;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int64_t keepThroughStep) {
  if (endsWith(path, ".csv")) csv_ = true;
  else if (endsWith(path, ".jsonl") || endsWith(path, ".json")) csv_ = false;
  else throw UserError("--metrics " + path + ": use a .csv, .jsonl or .json file name");
  const std::vector<std::string> kept = keepThroughStep >= 0 ? keptRows(path, csv_, keepThroughStep) : std::vector<std::string>{};
  out_.open(path);
  if (!out_) throw UserError("--metrics " + path + ": cannot open the file for writing");
  out_.precision(9);
  if (csv_) out_ << kCsvHeader << "\n";
  for (const std::string& row : kept) out_ << row << "\n";
  out_.flush();
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
