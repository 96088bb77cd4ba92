// The module `pureattention._pureattention`: nanobind bindings over the frontend (config, training,
// checkpoints, predict, --compare, graph and kernel dumps). Everything is the C++ the commands
// run; python/pureattention/ wraps it in the documented API (README "Python").
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/checkpoint.h"
#include "frontend/compare.h"
#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/predict.h"
#include "frontend/trainer.h"

namespace nb = nanobind;
namespace fs = std::filesystem;

namespace pa {
namespace {

using Array = nb::ndarray<nb::numpy, float, nb::c_contig>;
using DoubleArray = nb::ndarray<nb::numpy, double, nb::c_contig>;
using InArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using AnyArray = nb::ndarray<nb::ro>;  // any dtype, layout and device: checked by the callee
using CudaArray = nb::ndarray<float, nb::c_contig, nb::device::cuda>;

// A NumPy array that owns `v`, of shape `shape`.
template <class T>
nb::ndarray<nb::numpy, T, nb::c_contig> toNumpy(std::vector<T> v, std::vector<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::c_contig>(owned->data(), shape.size(), shape.data(), del);
}

std::vector<size_t> withRows(int64_t rows, const std::vector<int64_t>& sample) {
  std::vector<size_t> s{static_cast<size_t>(rows)};
  for (int64_t d : sample) s.push_back(static_cast<size_t>(d));
  return s;
}

std::string shapeText(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

template <class A>
std::vector<int64_t> shapeOf(const A& x) {
  std::vector<int64_t> s;
  for (size_t i = 0; i < x.ndim(); ++i) s.push_back(static_cast<int64_t>(x.shape(i)));
  return s;
}

// NumPy's name for a DLPack dtype ("float64", "bfloat16", "int32").
std::string dtypeName(const nb::dlpack::dtype& t) {
  using Code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<Code>(t.code)) {
  case Code::Int: kind = "int"; break;
  case Code::UInt: kind = "uint"; break;
  case Code::Float: kind = "float"; break;
  case Code::Bfloat: kind = "bfloat"; break;
  case Code::Complex: kind = "complex"; break;
  case Code::Bool: return "bool";
  default: kind = "dlpack-type-" + std::to_string(t.code) + "-"; break;
  }
  return kind + std::to_string(t.bits) + (t.lanes > 1 ? "x" + std::to_string(t.lanes) : "");
}

// Whether x's elements lie in row-major order without gaps (dimensions of extent 1 may have any
// stride; an empty array is contiguous).
bool rowMajor(const AnyArray& x) {
  int64_t expected = 1;
  for (size_t i = x.ndim(); i-- > 0;) {
    if (x.shape(i) == 0) return true;
    if (x.shape(i) != 1 && x.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(x.shape(i));
  }
  return true;
}

// A temporary folder, removed with everything in it when this goes.
class TempDir {
public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "pureattention-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary folder in " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

std::string readText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The samples of `x` [rows, ...] and `y` [rows, ...] as a data set (the Python layer has made
// both float32 and C-contiguous).
std::shared_ptr<const Dataset> datasetOf(const InArray& x, const InArray& y) {
  if (x.ndim() < 2 || y.ndim() < 2)
    throw nb::value_error(("x and y: expected arrays of shape (rows, ...) with one sample a row; got x of " +
                           std::to_string(x.ndim()) + " and y of " + std::to_string(y.ndim()) + " dimension(s)")
                              .c_str());
  if (x.shape(0) != y.shape(0))
    throw nb::value_error(("x and y: " + std::to_string(x.shape(0)) + " rows of x and " + std::to_string(y.shape(0)) +
                           " of y; expected as many targets as inputs")
                              .c_str());
  auto d = std::make_shared<Dataset>();
  d->count = static_cast<int64_t>(x.shape(0));
  for (size_t i = 1; i < x.ndim(); ++i) d->xShape.push_back(static_cast<int64_t>(x.shape(i)));
  for (size_t i = 1; i < y.ndim(); ++i) d->yShape.push_back(static_cast<int64_t>(y.shape(i)));
  d->x.assign(x.data(), x.data() + x.size());
  d->y.assign(y.data(), y.data() + y.size());
  return d;
}

// A model: its config and, once it has parameters (trained, loaded, or initialised for a
// query), the state a checkpoint holds, kept in memory. Training continues from that state as
// --resume continues a checkpoint.
class Model {
public:
  explicit Model(Config cfg) : cfg_(std::move(cfg)) {}

  static Model fromFile(const std::string& path, const std::vector<std::string>& sets) {
    return Model(loadConfig(path, sets));
  }
  static Model fromText(const std::string& text, const std::string& name, const std::vector<std::string>& sets) {
    return Model(parseConfig(text, name, sets));
  }
  static Model load(const std::string& path, const std::vector<std::string>& sets) {
    const std::string folder = findCheckpoint(path, "Model.load");
    Checkpoint ck = readCheckpoint(folder);
    const std::string weights = (fs::path(folder) / kModelFile).string();
    Model m(configFromWeights(safetensors::readMetadata(weights), weights, sets, "Model.load"));
    ck.folder.clear();  // held in memory: training goes on without writing beside it
    m.state_ = std::make_shared<Checkpoint>(std::move(ck));
    return m;
  }

  std::string name() const { return cfg_.name; }
  std::string configYaml() const { return resolvedConfigYaml(cfg_); }
  int64_t stepsTaken() const { return state_ ? state_->state.step : 0; }

  void setDevice(const std::string& device) { device_ = device; }

  // Trains `steps` more steps (nullopt: the config's train.steps, or its epochs on a new model).
  nb::dict train(std::optional<int64_t> steps, nb::object callback, std::optional<InArray> x, std::optional<InArray> y,
                 bool verbose) {
    if (steps && *steps < 0) throw nb::value_error("steps: expected a whole number of steps, 0 or more");
    if (x.has_value() != y.has_value()) throw nb::value_error("give both x and y (inputs and targets), or neither");
    Config cfg = withArrays(x, y);
    RunOptions opt = options(verbose);
    const int64_t done = stepsTaken();
    if (steps) opt.steps = done + *steps;
    else if (done > 0) opt.steps = done + cfg.train.steps;
    opt.resumeState = state_;
    std::vector<double> step, loss, val, lr, ms;
    std::optional<nb::python_error> pending;  // a Python exception (Ctrl-C, the callback's) to raise after the run
    bool stop = false;
    opt.onStep = [&](const StepMetrics& m) {
      step.push_back(static_cast<double>(m.step));
      loss.push_back(m.loss);
      val.push_back(m.valLoss < 0 ? std::nan("") : m.valLoss);
      lr.push_back(m.lr);
      ms.push_back(m.ms);
      if (callback.is_none() || pending) return;
      nb::gil_scoped_acquire gil;
      try {
        nb::dict d;
        d["step"] = m.step;
        d["loss"] = m.loss;
        d["val_loss"] = m.valLoss < 0 ? std::nan("") : m.valLoss;
        d["lr"] = m.lr;
        d["step_ms"] = m.ms;
        nb::object r = callback(d);
        if (!r.is_none() && !nb::cast<bool>(r)) stop = true;  // False ends training after this step
      } catch (nb::python_error& e) {
        pending.emplace(std::move(e));
      }
    };
    opt.stopRequested = [&] {
      if (stop || pending) return true;
      nb::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) pending.emplace();  // KeyboardInterrupt, raised by Python's handler
      return pending.has_value();
    };
    TrainResult res;
    {
      nb::gil_scoped_release release;
      PreparedRun run = prepareRun(cfg, opt);
      res = trainPrepared(cfg, opt, run);
      keep(run);
    }
    if (pending) throw std::move(*pending);  // the state after the last step taken is kept
    nb::dict out;
    out["step"] = toNumpy(std::move(step), {res.losses.size()});
    out["loss"] = toNumpy(std::move(loss), {res.losses.size()});
    out["val_loss"] = toNumpy(std::move(val), {res.losses.size()});
    out["lr"] = toNumpy(std::move(lr), {res.losses.size()});
    out["step_ms"] = toNumpy(std::move(ms), {res.losses.size()});
    out["final_validation"] = res.finalValidation < 0 ? std::nan("") : res.finalValidation;
    out["seconds_per_step"] = res.secondsPerStep;
    out["device"] = res.device;
    out["parameters"] = res.parameterCount;
    out["stopped_early"] = opt.steps >= 0 && static_cast<int64_t>(res.losses.size()) < opt.steps - done;
    return out;
  }

  nb::dict stateDict() {
    materialize();
    const bool f64 = cfg_.precision == Precision::Fp64;
    nb::dict d;
    for (const auto& kv : state_->state.params) {
      const std::vector<int64_t>& shape = state_->shapes.at(kv.first);
      std::vector<size_t> s(shape.begin(), shape.end());
      if (f64) d[kv.first.c_str()] = toNumpy(kv.second, s);
      else d[kv.first.c_str()] = toNumpy(std::vector<float>(kv.second.begin(), kv.second.end()), s);
    }
    return d;
  }

  // Names and shapes must be the model's, all of them; the optimizer state is kept.
  void loadStateDict(const std::map<std::string, nb::ndarray<const double, nb::c_contig, nb::device::cpu>>& d) {
    materialize();
    std::vector<std::string> problems;
    auto next = std::make_shared<Checkpoint>(*state_);
    for (const auto& kv : state_->shapes)
      if (!d.count(kv.first)) problems.push_back("'" + kv.first + "' is missing (shape " + shapeText(kv.second) + ")");
    for (const auto& kv : d) {
      auto it = state_->shapes.find(kv.first);
      if (it == state_->shapes.end()) {
        problems.push_back("'" + kv.first + "' is no parameter of this model");
        continue;
      }
      std::vector<int64_t> got;
      for (size_t i = 0; i < kv.second.ndim(); ++i) got.push_back(static_cast<int64_t>(kv.second.shape(i)));
      if (got != it->second) {
        problems.push_back("'" + kv.first + "' has shape " + shapeText(got) + ", the model's is " + shapeText(it->second));
        continue;
      }
      next->state.params[kv.first].assign(kv.second.data(), kv.second.data() + kv.second.size());
    }
    if (!problems.empty()) {
      std::string msg = "load_state_dict: the tensors do not fit the model:";
      for (const std::string& p : problems) msg += "\n  " + p;
      throw nb::value_error(msg.c_str());
    }
    state_ = std::move(next);
  }

  std::string save(const std::string& dir) {
    materialize();
    const bool final = state_->state.step >= state_->record.totalSteps;
    return writeCheckpoint(dir, state_->state, state_->shapes, state_->record, final);
  }

  Array predict(const InArray& x) {
    materialize();
    const int64_t rows = checkRows(shapeOf(x));
    std::vector<float> out;
    {
      nb::gil_scoped_release release;
      RunOptions ropt = options(false);
      const std::string device = resolveDevice(cfg_, ropt);
      if (rows > 0) out = predictRows(cfg_, state_->record.sampleX, state_->record.sampleY, state_->state.params, device,
                                      0, x.data(), nullptr, rows);
    }
    return toNumpy(std::move(out), withRows(rows, state_->record.sampleY));
  }

  // Whether the model runs on the GPU (device cuda, or auto with one); a ValueError where it is
  // told to and there is none.
  bool runsOnCuda() const {
    RunOptions ropt = options(false);
    return resolveDevice(cfg_, ropt) == "cuda";
  }

  // predict for rows in CUDA memory on a model that runs on the GPU: the same batches and kernels
  // as predict (so the same bits), fed and drained by device-to-device copies. The result is a
  // new device allocation owned by the returned array (freed when the last array or tensor that
  // wraps it goes), complete when this returns; x must be float32, row-major, on the model's
  // device. Waits for all work queued on the device before reading x (README "DLPack and CUDA
  // memory").
  CudaArray predictCuda(const AnyArray& x) {
    if (x.device_type() != nb::device::cuda::value)
      throw nb::type_error(("predict_cuda: x is not in CUDA memory (DLPack device type " +
                            std::to_string(x.device_type()) + ")")
                               .c_str());
    if (!runsOnCuda())
      throw nb::value_error("predict: x is in CUDA memory but this model runs on the CPU (model.to(\"cuda\") runs it on the GPU)");
    const int ordinal = predictDeviceOrdinal();
    if (x.device_id() != ordinal)
      throw nb::value_error(("predict: x is on CUDA device " + std::to_string(x.device_id()) + "; the model runs on device " +
                             std::to_string(ordinal) + ": move x there first (PyTorch: x.to(\"cuda:" +
                             std::to_string(ordinal) + "\"))")
                                .c_str());
    if (x.dtype() != nb::dtype<float>())
      throw nb::type_error(("predict: x is a CUDA array of " + dtypeName(x.dtype()) +
                            "; the model reads float32 on the GPU: convert it there first (PyTorch: x.float(); "
                            "CuPy: x.astype(cupy.float32)), or pass a host array")
                               .c_str());
    if (!rowMajor(x))
      throw nb::value_error(("predict: x is a CUDA array of shape " + shapeText(shapeOf(x)) +
                             " that is not C-contiguous; the model reads its rows in place: make it contiguous first "
                             "(PyTorch: x.contiguous(); CuPy: cupy.ascontiguousarray(x))")
                                .c_str());
    materialize();
    const int64_t rows = checkRows(shapeOf(x));
    const auto at = static_cast<cuda::CUdeviceptr>(reinterpret_cast<uintptr_t>(x.data()));
    cuda::DeviceBuffer out;
    {
      nb::gil_scoped_release release;
      out = predictRowsOnDevice(cfg_, state_->record.sampleX, state_->record.sampleY, state_->state.params, 0, at, rows);
    }
    // Zero rows: a valid address all the same, as some consumers refuse an empty array at null.
    if (rows == 0) out = cuda::DeviceBuffer(sizeof(float));
    auto* owned = new cuda::DeviceBuffer(std::move(out));
    nb::capsule del(owned, [](void* p) noexcept {
      try {
        predictDeviceOrdinal();  // the device's context current on this thread, for cuMemFree
      } catch (...) {
      }
      delete static_cast<cuda::DeviceBuffer*>(p);
    });
    const std::vector<size_t> shape = withRows(rows, state_->record.sampleY);
    return CudaArray(reinterpret_cast<float*>(static_cast<uintptr_t>(owned->ptr())), shape.size(), shape.data(), del,
                     nullptr, nb::dtype<float>(), nb::device::cuda::value, ordinal);
  }

  // --compare from the model's current weights; the table is what `train --compare` prints.
  nb::dict compare(std::optional<int64_t> steps, std::optional<InArray> x, std::optional<InArray> y) {
    Config cfg = withArrays(x, y);
    RunOptions opt = options(false);
    if (steps) opt.steps = *steps;
    if (state_) opt.initialParams = state_->state.params;
    CompareResult r;
    std::string table;
    {
      nb::gil_scoped_release release;
      char* buf = nullptr;
      size_t len = 0;
      std::FILE* out = ::open_memstream(&buf, &len);
      if (!out) throw std::runtime_error("open_memstream failed");
      try {
        r = compareFusedUnfused(cfg, opt, out);
      } catch (...) {
        std::fclose(out);
        std::free(buf);
        throw;
      }
      std::fclose(out);
      table.assign(buf, len);
      std::free(buf);
    }
    auto side = [](const TrainResult& t) {
      nb::dict d;
      d["loss"] = toNumpy(t.losses, {t.losses.size()});
      d["seconds_per_step"] = t.secondsPerStep;
      d["nodes"] = t.trainNodes;
      d["forward_nodes"] = t.forwardNodes;
      d["activation_bytes"] = t.activationBytes;
      d["device"] = t.device;
      return d;
    };
    nb::dict d;
    d["fused"] = side(r.fused);
    d["unfused"] = side(r.unfused);
    d["grad_rel_diff"] = r.gradRelDiff;
    d["max_loss_rel_diff"] = r.maxLossRelDiff;
    d["max_grad_rel_diff"] = r.maxGradRelDiff;
    d["max_free_loss_rel_diff"] = r.maxFreeLossRelDiff;
    d["tolerance"] = r.tolerance;
    d["agree"] = r.agree;
    d["table"] = table;
    return d;
  }

  // The graph after each stage as --dump-graph writes it: stage name -> (text, DOT), in order.
  std::vector<std::vector<std::string>> graphs() {
    const TempDir dir;
    RunOptions opt = options(false);
    opt.dumpGraphDir = dir.path();
    {
      nb::gil_scoped_release release;
      std::vector<int64_t> sx, sy;
      sampleShapes(sx, sy);
      compileTrainingGraph(cfg_, opt, sx, sy, cfg_.train.batchSize);
    }
    std::vector<std::vector<std::string>> out;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().extension() == ".txt") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      const std::string stem = f.stem().string();  // NN-<stage>
      fs::path dot = f;
      dot.replace_extension(".dot");
      out.push_back({stem.substr(stem.find('-') + 1), readText(f), readText(dot)});
    }
    return out;
  }

  // The CUDA source of every kernel of the training step, as --dump-kernels writes it.
  std::map<std::string, std::string> kernels() {
    const TempDir dir;
    RunOptions opt = options(false);
    opt.dumpKernelsDir = dir.path();
    opt.steps = stepsTaken();
    opt.resumeState = state_;
    {
      nb::gil_scoped_release release;
      prepareRun(cfg_, opt);
    }
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().extension() == ".cu") out[e.path().stem().string()] = readText(e.path());
    return out;
  }

private:
  // The rows of an input of shape `shape`: a row is the sample's shape, or as many values flat
  // (the command's CSV rows).
  int64_t checkRows(const std::vector<int64_t>& shape) const {
    const std::vector<int64_t>& sx = state_->record.sampleX;
    int64_t rowValues = 1, sampleValues = 1;
    for (size_t i = 1; i < shape.size(); ++i) rowValues *= shape[i];
    for (int64_t d : sx) sampleValues *= d;
    if (shape.size() < 2 || rowValues != sampleValues)
      throw nb::value_error(("predict: x of shape " + shapeText(shape) + "; the model takes rows of shape " + shapeText(sx) +
                             ": expected (rows, " + shapeText(sx).substr(1) + " or (rows, " + std::to_string(sampleValues) +
                             ")")
                                .c_str());
    return shape[0];
  }

  RunOptions options(bool verbose) const {
    RunOptions opt;
    opt.device = device_;
    opt.printSummary = verbose;
    opt.progress = verbose ? ProgressMode::Lines : ProgressMode::Quiet;
    return opt;
  }

  // The config, with `x` and `y` as its data (kind arrays) when given; arrays given once stay
  // the model's data.
  Config withArrays(const std::optional<InArray>& x, const std::optional<InArray>& y) {
    if (x) {
      cfg_.data.kind = "arrays";
      cfg_.data.arrays = datasetOf(*x, *y);
    }
    return cfg_;
  }

  void keep(const PreparedRun& run) {
    auto ck = std::make_shared<Checkpoint>();
    ck->state = run.session->state();
    ck->shapes = run.shapes;
    ck->record = run.record;
    state_ = std::move(ck);
  }

  // The model's parameters: from the seed (or the config's init) when it has none yet.
  void materialize() {
    if (state_) return;
    RunOptions opt = options(false);
    opt.steps = 0;
    nb::gil_scoped_release release;
    PreparedRun run = prepareRun(cfg_, opt);
    keep(run);
  }

  void sampleShapes(std::vector<int64_t>& sx, std::vector<int64_t>& sy) const {
    if (state_) {
      sx = state_->record.sampleX;
      sy = state_->record.sampleY;
      return;
    }
    const std::string base = fs::path(cfg_.file).has_parent_path() ? fs::path(cfg_.file).parent_path().string() : ".";
    const DataSplit data = loadData(cfg_.data, cfg_.seed, base);
    sx = data.train.xShape;
    sy = data.train.yShape;
  }

  Config cfg_;
  std::string device_;
  std::shared_ptr<const Checkpoint> state_;
};

}  // namespace
}  // namespace pa

NB_MODULE(_pureattention, m) {
  using pa::Model;
  m.doc() = "PureAttention's C++ frontend (use the package `pureattention`)";
  // User mistakes: located config errors become pureattention.ConfigError (a ValueError with
  // file, line, column and key path), other user errors ValueError.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pa::ConfigError& e) {
      nb::object cls = nb::module_::import_("pureattention._errors").attr("ConfigError");
      nb::object err = cls(e.what(), e.location(), e.keyPath());
      PyErr_SetObject(cls.ptr(), err.ptr());
    } catch (const pa::UserError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  nb::class_<Model>(m, "_Model")
      .def_static("from_file", &Model::fromFile, nb::arg("path"), nb::arg("sets"))
      .def_static("from_text", &Model::fromText, nb::arg("text"), nb::arg("name"), nb::arg("sets"))
      .def_static("load", &Model::load, nb::arg("path"), nb::arg("sets"))
      .def_prop_ro("name", &Model::name)
      .def_prop_ro("config_yaml", &Model::configYaml)
      .def_prop_ro("steps_taken", &Model::stepsTaken)
      .def("set_device", &Model::setDevice)
      .def("train", &Model::train, nb::arg("steps").none(), nb::arg("callback").none(), nb::arg("x").none(),
           nb::arg("y").none(), nb::arg("verbose"))
      .def("state_dict", &Model::stateDict)
      .def("load_state_dict", &Model::loadStateDict)
      .def("save", &Model::save)
      .def("predict", &Model::predict)
      .def("predict_cuda", &Model::predictCuda)
      .def_prop_ro("runs_on_cuda", &Model::runsOnCuda)
      .def("compare", &Model::compare, nb::arg("steps").none(), nb::arg("x").none(), nb::arg("y").none())
      .def("graphs", &Model::graphs)
      .def("kernels", &Model::kernels);
  // A no-op for measuring the cost of a call through the bindings (bench/python_call_overhead.py).
  m.def("_noop", [](int64_t v) { return v; });
}
