// Dataset generation and CSV loading.
#include "frontend/datasets.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "frontend/rng.h"

namespace pa {

int64_t Dataset::xSize() const { return std::accumulate(xShape.begin(), xShape.end(), int64_t{1}, std::multiplies<>()); }
int64_t Dataset::ySize() const { return std::accumulate(yShape.begin(), yShape.end(), int64_t{1}, std::multiplies<>()); }

namespace {

// Sample i of a sine task: channel c is sin((c+1)·(2π t / period) + phase_c) plus noise on the
// inputs; the target is channel 0's clean signal `horizon` steps ahead.
void makeSine(const DataConfig& d, uint64_t seed, Dataset& all) {
  const int64_t w = d.window, h = d.horizon, ch = d.channels;
  all.count = d.samples;
  all.xShape = {w, ch};
  all.yShape = d.target == "next" ? std::vector<int64_t>{h} : std::vector<int64_t>{w, 1};
  all.x.resize(static_cast<size_t>(all.count * w * ch));
  all.y.resize(static_cast<size_t>(all.count * all.ySize()));
  Rng rng = Rng::stream(seed, "data/sine");
  std::vector<double> phase(static_cast<size_t>(ch));
  for (int64_t i = 0; i < all.count; ++i) {
    const double period = rng.uniform(d.periodMin, d.periodMax);
    const double omega = 6.283185307179586 / period;
    for (double& p : phase) p = rng.uniform(0.0, 6.283185307179586);
    auto signal = [&](int64_t t, int64_t c) { return std::sin((c + 1) * omega * t + phase[c]); };
    float* x = all.x.data() + i * w * ch;
    for (int64_t t = 0; t < w; ++t)
      for (int64_t c = 0; c < ch; ++c) x[t * ch + c] = static_cast<float>(signal(t, c) + d.noise * rng.normal());
    float* y = all.y.data() + i * all.ySize();
    if (d.target == "next")
      for (int64_t k = 0; k < h; ++k) y[k] = static_cast<float>(signal(w + k, 0));
    else
      for (int64_t t = 0; t < w; ++t) y[t] = static_cast<float>(signal(t + h, 0));
  }
}

double applyFn(const std::string& fn, double x) {
  if (fn == "sin") return std::sin(x);
  if (fn == "cos") return std::cos(x);
  if (fn == "sinc") return x == 0.0 ? 1.0 : std::sin(3.141592653589793 * x) / (3.141592653589793 * x);
  if (fn == "gaussian") return std::exp(-x * x);
  if (fn == "cubic") return x * x * x;
  return std::fabs(x);  // abs
}

// y = mean over inputs of fn(x_i), x uniform in the range; noise on the target.
void makeFunction(const DataConfig& d, uint64_t seed, Dataset& all) {
  all.count = d.samples;
  all.xShape = {d.inputs};
  all.yShape = {1};
  all.x.resize(static_cast<size_t>(all.count * d.inputs));
  all.y.resize(static_cast<size_t>(all.count));
  Rng rng = Rng::stream(seed, "data/function");
  for (int64_t i = 0; i < all.count; ++i) {
    double acc = 0.0;
    for (int64_t j = 0; j < d.inputs; ++j) {
      const double x = rng.uniform(d.rangeLo, d.rangeHi);
      all.x[static_cast<size_t>(i * d.inputs + j)] = static_cast<float>(x);
      acc += applyFn(d.fn, x);
    }
    all.y[static_cast<size_t>(i)] = static_cast<float>(acc / static_cast<double>(d.inputs) + d.noise * rng.normal());
  }
}

std::vector<std::string> splitCsvLine(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) {
      cells.push_back(cur);
      cur.clear();
    } else if (c != '\r') cur += c;
  }
  cells.push_back(cur);
  for (std::string& s : cells) {
    const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    s = b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  return cells;
}

void makeCsv(const DataConfig& d, const std::string& baseDir, Dataset& all) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(d.path).is_absolute() ? fs::path(d.path) : fs::path(baseDir) / d.path;
  std::ifstream in(path);
  if (!in) throw UserError("data.path: cannot read CSV file '" + path.string() + "'");
  std::string line;
  int64_t lineNo = 0;
  std::vector<std::string> header;
  std::vector<std::vector<double>> rows;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::vector<std::string> cells = splitCsvLine(line);
    if (d.header && header.empty()) {
      header = cells;
      continue;
    }
    if (header.empty())
      for (size_t i = 0; i < cells.size(); ++i) header.push_back("column" + std::to_string(i));
    if (cells.size() != header.size())
      throw UserError(path.string() + ":" + std::to_string(lineNo) + ": expected " + std::to_string(header.size()) +
                      " cells, got " + std::to_string(cells.size()));
    std::vector<double> row;
    size_t col = 1;
    for (size_t i = 0; i < cells.size(); ++i) {
      const std::string& s = cells[i];
      double v = 0;
      size_t used = 0;
      bool ok = !s.empty();
      try {
        v = std::stod(s, &used);
      } catch (const std::exception&) {
        ok = false;
      }
      if (!ok || used != s.size())
        throw UserError(path.string() + ":" + std::to_string(lineNo) + ":" + std::to_string(col) + ": column '" +
                        header[i] + "': '" + s + "' is not a number");
      if (!std::isfinite(v))
        throw UserError(path.string() + ":" + std::to_string(lineNo) + ":" + std::to_string(col) + ": column '" +
                        header[i] + "': " + s + " (NaN or infinite values cannot be trained on)");
      row.push_back(v);
      col += s.size() + 1;
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw UserError(path.string() + ": no data rows");
  auto indexOf = [&](const std::string& name, const char* key) {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end())
      throw UserError(std::string("data.") + key + ": no column '" + name + "' in " + path.string() +
                      "; columns: " + joinChoices(header));
    return static_cast<size_t>(it - header.begin());
  };
  std::vector<size_t> tgt, feat;
  for (const std::string& t : d.targets) tgt.push_back(indexOf(t, "targets"));
  if (tgt.empty()) tgt.push_back(header.size() - 1);
  for (const std::string& f : d.features) feat.push_back(indexOf(f, "features"));
  if (feat.empty())
    for (size_t i = 0; i < header.size(); ++i)
      if (std::find(tgt.begin(), tgt.end(), i) == tgt.end()) feat.push_back(i);
  if (feat.empty()) throw UserError("data: the CSV file " + path.string() + " has no feature columns left");
  all.count = static_cast<int64_t>(rows.size());
  all.xShape = {static_cast<int64_t>(feat.size())};
  all.yShape = {static_cast<int64_t>(tgt.size())};
  for (const auto& r : rows) {
    for (size_t f : feat) all.x.push_back(static_cast<float>(r[f]));
    for (size_t t : tgt) all.y.push_back(static_cast<float>(r[t]));
  }
}

Dataset take(const Dataset& all, const std::vector<int64_t>& idx, size_t from, size_t to) {
  Dataset d;
  d.xShape = all.xShape;
  d.yShape = all.yShape;
  d.count = static_cast<int64_t>(to - from);
  const int64_t xs = all.xSize(), ys = all.ySize();
  d.x.reserve(static_cast<size_t>(d.count * xs));
  d.y.reserve(static_cast<size_t>(d.count * ys));
  for (size_t i = from; i < to; ++i) {
    d.x.insert(d.x.end(), all.x.begin() + idx[i] * xs, all.x.begin() + (idx[i] + 1) * xs);
    d.y.insert(d.y.end(), all.y.begin() + idx[i] * ys, all.y.begin() + (idx[i] + 1) * ys);
  }
  return d;
}

}  // namespace

DataSplit loadData(const DataConfig& cfg, uint64_t seed, const std::string& baseDir) {
  Dataset all;
  DataSplit split;
  if (cfg.kind == "sine") {
    makeSine(cfg, seed, all);
    split.description = "sine: " + std::to_string(cfg.samples) + " windows of " + std::to_string(cfg.window) + " steps x " +
                        std::to_string(cfg.channels) + " channel(s), target " + cfg.target;
  } else if (cfg.kind == "function") {
    makeFunction(cfg, seed, all);
    split.description = "function: y = mean(" + cfg.fn + "(x_i)) over " + std::to_string(cfg.inputs) + " input(s)";
  } else {
    makeCsv(cfg, baseDir, all);
    split.description = "csv: " + cfg.path + ", " + std::to_string(all.count) + " rows";
  }
  std::vector<int64_t> idx(static_cast<size_t>(all.count));
  std::iota(idx.begin(), idx.end(), 0);
  if (cfg.shuffle) {
    Rng rng = Rng::stream(seed, "data/split");
    for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[rng.below(i)]);
  }
  const size_t nVal = static_cast<size_t>(std::floor(cfg.validation * static_cast<double>(all.count)));
  if (all.count - static_cast<int64_t>(nVal) < 1) throw UserError("data: no training samples left after the validation split");
  split.validation = take(all, idx, 0, nVal);
  split.train = take(all, idx, nVal, idx.size());
  return split;
}

}  // namespace pa
