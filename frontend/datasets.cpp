// Dataset generation and CSV loading.
#include "frontend/datasets.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "common/rng.h"

namespace pa {

int64_t Dataset::xSize() const { return std::accumulate(xShape.begin(), xShape.end(), int64_t{1}, std::multiplies<>()); }
int64_t Dataset::ySize() const { return std::accumulate(yShape.begin(), yShape.end(), int64_t{1}, std::multiplies<>()); }

namespace {

// Sample i of a sine task: channel c is sin((c+1)·(2π t / period) + phase_c) plus noise on the
// inputs; the target is channel 0's clean signal `horizon` steps ahead (or `delay` steps back:
// before the window starts, the signal continues backwards, which the inputs cannot show).
// Generated data is held in memory as float32; a size beyond kMaxDataValues is refused before
// allocating (it was std::bad_alloc, exit 1). Sample indices are 32-bit on the GPU.
constexpr double kMaxDataValues = 4294967296.0;  // 2^32 floats: 16 GiB

void checkDataSize(const DataConfig& d, double valuesPerSample) {
  const double values = static_cast<double>(d.samples) * valuesPerSample;
  if (values > kMaxDataValues || d.samples > INT32_MAX)
    d.where.fail("data.samples", std::to_string(d.samples) + " samples of " + formatNumber(valuesPerSample) +
                                     " values each are " + formatNumber(values * 4.0 / 1073741824.0) +
                                     " GiB of float32; the limit is 2^32 values (16 GiB) and 2^31 - 1 samples");
}

// Where generated sample j goes: straight into its place in the validation or the training split
// (the split's order, data.shuffle's permutation), so that the samples are never copied.
class Placement {
public:
  Placement(DataSplit& split, std::vector<int64_t> slot, int64_t validationCount)
      : split_(split), slot_(std::move(slot)), nVal_(validationCount), xs_(split.train.xSize()), ys_(split.train.ySize()) {}
  float* x(int64_t j) const { return rowOf(j, true); }
  float* y(int64_t j) const { return rowOf(j, false); }

private:
  float* rowOf(int64_t j, bool x) const {
    const int64_t at = slot_[static_cast<size_t>(j)];
    Dataset& d = at < nVal_ ? split_.validation : split_.train;
    const int64_t row = at < nVal_ ? at : at - nVal_;
    return x ? d.x.data() + row * xs_ : d.y.data() + row * ys_;
  }
  DataSplit& split_;
  std::vector<int64_t> slot_;
  int64_t nVal_, xs_, ys_;
};

void makeSine(const DataConfig& d, uint64_t seed, const Placement& to) {
  const int64_t w = d.window, h = d.horizon, ch = d.channels;
  const int64_t ySize = d.target == "next" ? h : w;
  const int64_t shift = d.target == "delayed" ? -d.delay : h;  // target at t: channel 0 at t + shift
  // Samples are drawn from one stream in order: a period, a phase per channel, then a normal (two
  // draws) per input value. The states where each sample starts are found first by jumping the
  // generator a sample's draws ahead, so that the samples, whose sines and logarithms are the
  // cost, can be made in parallel with exactly the numbers of the sequential loop.
  const Rng::State first = Rng::stream(seed, "data/sine").state();
  const Rng::Jump sample(static_cast<uint64_t>(1 + ch + 2 * w * ch));
  std::vector<Rng::State> start(static_cast<size_t>(d.samples));
  for (int64_t i = 0; i < d.samples; ++i) start[static_cast<size_t>(i)] = i ? sample.apply(start[static_cast<size_t>(i - 1)]) : first;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < d.samples; ++i) {
    Rng r(0);
    r.setState(start[static_cast<size_t>(i)]);
    std::vector<double> phase(static_cast<size_t>(ch));
    const double period = r.uniform(d.periodMin, d.periodMax);
    const double omega = 6.283185307179586 / period;
    for (double& p : phase) p = r.uniform(0.0, 6.283185307179586);
    auto signal = [&](int64_t t, int64_t c) { return std::sin((c + 1) * omega * t + phase[c]); };
    float* x = to.x(i);
    for (int64_t t = 0; t < w; ++t)
      for (int64_t c = 0; c < ch; ++c) x[t * ch + c] = static_cast<float>(signal(t, c) + d.noise * r.normal());
    float* y = to.y(i);
    if (d.target == "next")
      for (int64_t k = 0; k < h; ++k) y[k] = static_cast<float>(signal(w + k, 0));
    else
      for (int64_t t = 0; t < ySize; ++t) y[t] = static_cast<float>(signal(t + shift, 0));
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
void makeFunction(const DataConfig& d, uint64_t seed, const Placement& to) {
  Rng rng = Rng::stream(seed, "data/function");
  for (int64_t i = 0; i < d.samples; ++i) {
    double acc = 0.0;
    float* xi = to.x(i);
    for (int64_t j = 0; j < d.inputs; ++j) {
      const double x = rng.uniform(d.rangeLo, d.rangeHi);
      xi[j] = static_cast<float>(x);
      acc += applyFn(d.fn, x);
    }
    const double y = acc / static_cast<double>(d.inputs) + d.noise * rng.normal();
    if (!(std::fabs(y) <= FLT_MAX))  // cubic on a wide range
      d.where.fail("data.range", "the target " + d.fn + "(x) reaches " + formatNumber(y) +
                                     ", beyond float32 (data is stored in float32: |y| <= 3.4e38); narrow the range");
    *to.y(i) = static_cast<float>(y);
  }
}

struct CsvCell {
  std::string text;  // without surrounding blanks and quotes
  size_t column;     // 1-based column of its first character in the line
};

// One CSV line into cells; a quoted cell may hold commas. Columns count the bytes of the line as
// read (after a byte-order mark), so they point at the cell as an editor shows it.
std::vector<CsvCell> splitCsvLine(const std::string& line) {
  std::vector<CsvCell> cells;
  CsvCell cur{"", 0};
  bool quoted = false, blankSoFar = true;
  for (size_t i = 0; i <= line.size(); ++i) {
    const char c = i < line.size() ? line[i] : ',';
    if (c == ',' && !quoted) {
      if (cur.column == 0) cur.column = i + 1;
      const size_t e = cur.text.find_last_not_of(" \t");
      cur.text.erase(e == std::string::npos ? 0 : e + 1);
      cells.push_back(cur);
      cur = CsvCell{"", 0};
      blankSoFar = true;
      continue;
    }
    if (c == '\r' || ((c == ' ' || c == '\t') && blankSoFar && !quoted)) continue;
    if (cur.column == 0) cur.column = i + 1;
    blankSoFar = false;
    if (c == '"') quoted = !quoted;
    else cur.text += c;
  }
  return cells;
}

}  // namespace

CsvTable readCsvTable(std::istream& in, const std::string& path, bool hasHeader, const std::string& suffix) {
  auto fail = [&](int64_t lineNo, size_t col, const std::string& message) {
    throw UserError(path + ":" + std::to_string(lineNo) + ":" + std::to_string(col) + ": " + message + suffix);
  };
  CsvTable t;
  std::string line;
  int64_t lineNo = 0, headerLine = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (lineNo == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte-order mark
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<CsvCell> cells = splitCsvLine(line);
    if (hasHeader && t.header.empty()) {
      headerLine = lineNo;
      for (const CsvCell& c : cells) t.header.push_back(c.text);
      continue;
    }
    if (t.header.empty())
      for (size_t i = 0; i < cells.size(); ++i) t.header.push_back("column" + std::to_string(i));
    // A short row is located where its next cell would start (just past the line's last
    // character), a long one at its first extra cell.
    if (cells.size() != t.header.size())
      fail(lineNo,
           cells.size() > t.header.size() ? cells[t.header.size()].column : line.find_last_not_of(" \t\r") + 2,
           "expected " + std::to_string(t.header.size()) + " cells, got " + std::to_string(cells.size()));
    std::vector<double> row;
    for (size_t i = 0; i < cells.size(); ++i) {
      const std::string& s = cells[i].text;
      double v = 0;
      const NumberParse parsed = parseNumber(s, v);
      const std::string where = "column '" + t.header[i] + "': ";
      if (parsed == NumberParse::NotANumber) fail(lineNo, cells[i].column, where + "'" + s + "' is not a number");
      if (parsed == NumberParse::NotFinite)
        fail(lineNo, cells[i].column, where + s + " (NaN or infinite values cannot be trained on)");
      if (parsed == NumberParse::Overflow || std::fabs(v) > FLT_MAX)
        fail(lineNo, cells[i].column, where + s + " is beyond float32 (data is stored in float32: |x| <= 3.4e38)");
      row.push_back(v);
    }
    t.rows.push_back(std::move(row));
  }
  t.empty = lineNo == 0;
  if (!t.empty && t.rows.empty())  // at the header, or at the last (blank) line of a file without one
    fail(headerLine ? headerLine : lineNo, 1, "no data rows" + std::string(headerLine ? " below the header" : ""));
  return t;
}

namespace {

void makeCsv(const DataConfig& d, const std::string& baseDir, Dataset& all) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(d.path).is_absolute() ? fs::path(d.path) : fs::path(baseDir) / d.path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) d.where.fail("data.path", "'" + path.string() + "' is a directory, not a CSV file");
  std::ifstream in(path);
  if (!in) d.where.fail("data.path", "cannot read CSV file '" + path.string() + "'");
  // Errors inside the file name the cell and the key that named the file.
  const std::string pathKey = d.where.location("data.path");
  const std::string byKey = " (the CSV file of data.path" + (pathKey.empty() ? "" : ", " + pathKey) + ")";
  const CsvTable table = readCsvTable(in, path.string(), d.header, byKey);
  if (table.empty) d.where.fail("data.path", "the CSV file '" + path.string() + "' is empty");
  const std::vector<std::string>& header = table.header;
  const std::vector<std::vector<double>>& rows = table.rows;
  auto indexOf = [&](const std::string& name, const char* key) {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end())
      d.where.fail(std::string("data.") + key, "no column '" + name + "' in " + path.string() + suggestion(name, header, "columns"));
    if (std::find(it + 1, header.end(), name) != header.end())
      d.where.fail(std::string("data.") + key, "column '" + name + "' appears twice in the header of " + path.string());
    return static_cast<size_t>(it - header.begin());
  };
  std::vector<size_t> tgt, feat;
  for (const std::string& t : d.targets) tgt.push_back(indexOf(t, "targets"));
  if (tgt.empty()) tgt.push_back(header.size() - 1);
  for (const std::string& f : d.features) {
    feat.push_back(indexOf(f, "features"));
    if (std::find(tgt.begin(), tgt.end(), feat.back()) != tgt.end())  // the default target, the last column
      d.where.fail("data.features", "column '" + f + "' is also the target (data.targets defaults to the last column, '" +
                                        header.back() + "'); a model would see its own answer");
  }
  if (feat.empty())
    for (size_t i = 0; i < header.size(); ++i)
      if (std::find(tgt.begin(), tgt.end(), i) == tgt.end()) feat.push_back(i);
  if (feat.empty()) d.where.fail("data.targets", "the CSV file " + path.string() + " has no feature columns left");
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

namespace {

// The split's order: data.shuffle's permutation of the samples (the first `validation` go to the
// validation split), and the validation count, floor(data.validation × count).
std::vector<int64_t> splitOrder(const DataConfig& cfg, uint64_t seed, int64_t count) {
  std::vector<int64_t> idx(static_cast<size_t>(count));
  std::iota(idx.begin(), idx.end(), 0);
  if (cfg.shuffle) {
    Rng rng = Rng::stream(seed, "data/split");
    for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[rng.below(i)]);
  }
  return idx;
}

int64_t validationCountOf(const DataConfig& cfg, int64_t count) {
  const int64_t nVal = static_cast<int64_t>(std::floor(cfg.validation * static_cast<double>(count)));
  if (count - nVal < 1) cfg.where.fail("data.validation", "no training samples left after the validation split");
  return nVal;
}

}  // namespace

std::optional<DataShape> generatedDataShape(const DataConfig& cfg) {
  DataShape s;
  if (cfg.kind == "sine") {
    s.xShape = {cfg.window, cfg.channels};
    s.yShape = cfg.target == "next" ? std::vector<int64_t>{cfg.horizon} : std::vector<int64_t>{cfg.window, 1};
    s.description = "sine: " + std::to_string(cfg.samples) + " windows of " + std::to_string(cfg.window) + " steps x " +
                    std::to_string(cfg.channels) + " channel(s), target " + cfg.target;
  } else if (cfg.kind == "function") {
    s.xShape = {cfg.inputs};
    s.yShape = {1};
    s.description = "function: y = mean(" + cfg.fn + "(x_i)) over " + std::to_string(cfg.inputs) + " input(s)";
  } else {
    return std::nullopt;
  }
  const double values = static_cast<double>(std::accumulate(s.xShape.begin(), s.xShape.end(), int64_t{1}, std::multiplies<>())) +
                        static_cast<double>(std::accumulate(s.yShape.begin(), s.yShape.end(), int64_t{1}, std::multiplies<>()));
  checkDataSize(cfg, values);
  s.validationCount = validationCountOf(cfg, cfg.samples);
  s.trainCount = cfg.samples - s.validationCount;
  return s;
}

DataSplit loadData(const DataConfig& cfg, uint64_t seed, const std::string& baseDir) {
  DataSplit split;
  if (const std::optional<DataShape> shape = generatedDataShape(cfg)) {
    split.description = shape->description;
    for (Dataset* d : {&split.validation, &split.train}) {
      d->xShape = shape->xShape;
      d->yShape = shape->yShape;
      d->count = d == &split.train ? shape->trainCount : shape->validationCount;
      d->x.resize(static_cast<size_t>(d->count * d->xSize()));
      d->y.resize(static_cast<size_t>(d->count * d->ySize()));
    }
    const std::vector<int64_t> idx = splitOrder(cfg, seed, cfg.samples);
    std::vector<int64_t> slot(idx.size());  // sample j's position in the split order
    for (size_t p = 0; p < idx.size(); ++p) slot[static_cast<size_t>(idx[p])] = static_cast<int64_t>(p);
    const Placement to(split, std::move(slot), shape->validationCount);
    if (cfg.kind == "sine") makeSine(cfg, seed, to);
    else makeFunction(cfg, seed, to);
    return split;
  }
  Dataset all;
  if (cfg.kind == "csv") {
    makeCsv(cfg, baseDir, all);
    split.description = "csv: " + cfg.path + ", " + std::to_string(all.count) + " rows";
  } else {
    if (!cfg.arrays)
      cfg.where.fail("data.kind", "arrays: the samples come from a library caller (Python: Model.train(x=..., y=...)), "
                                  "and none were given");
    all = *cfg.arrays;
    split.description = "arrays: " + std::to_string(all.count) + " rows";
  }
  const std::vector<int64_t> idx = splitOrder(cfg, seed, all.count);
  const size_t nVal = static_cast<size_t>(validationCountOf(cfg, all.count));
  split.validation = take(all, idx, 0, nVal);
  split.train = take(all, idx, nVal, idx.size());
  return split;
}

}  // namespace pa
