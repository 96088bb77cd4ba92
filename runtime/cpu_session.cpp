// The CPU session: a training graph and a forward-only validation graph over shared parameters.
#include "runtime/cpu_session.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <utility>

#include "codegen/emit.h"
#include "codegen/flops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "passes/autodiff.h"
#include "runtime/batch_order.h"
#include "runtime/cpu_executor.h"

namespace pa {

namespace {

template <class T>
struct ParamState {
  std::string name;
  ValueId trainValue = kNoValue, evalValue = kNoValue, grad = kNoValue;
  std::vector<T> value, m, v;
};

template <class T>
class CpuSession final : public Session {
public:
  explicit CpuSession(SessionSpec spec);
  void enqueueStep(int64_t step) override { pending_.push_back(runStep(step)); }
  std::vector<double> takeLosses() override { return std::exchange(pending_, {}); }
  double validate() override;
  int64_t totalSteps() const override { return spec_.steps; }
  TrainResult& result() override { return res_; }
  void setParams(const std::map<std::string, std::vector<double>>& values) override {
    for (ParamState<T>& p : params_) {
      auto it = values.find(p.name);
      if (it != values.end()) std::copy(it->second.begin(), it->second.end(), p.value.begin());
    }
  }
  std::map<std::string, std::vector<double>> gradients() const override {
    std::map<std::string, std::vector<double>> r;
    for (const ParamState<T>& p : params_) {
      const T* gp = exec_->data(p.grad);
      r[p.name] = std::vector<double>(gp, gp + p.value.size());
    }
    return r;
  }
  std::map<std::string, std::vector<double>> params() const override {
    std::map<std::string, std::vector<double>> r;
    for (const ParamState<T>& p : params_) r[p.name] = std::vector<double>(p.value.begin(), p.value.end());
    return r;
  }
  int64_t stepsTaken() const override { return stepsTaken_; }
  TrainingState state() const override;
  void restore(const TrainingState& s) override;

private:
  double runStep(int64_t step);
  // Data parallel: replaces this rank's gradients by their mean over the ranks (one flat
  // buffer, the loss at its end) and returns the mean loss, the same on every rank.
  double averageOverRanks(double loss);
  SessionSpec spec_;
  std::vector<T> flat_;  // the all-reduce's buffer
  std::vector<double> pending_;  // losses not yet taken
  std::unique_ptr<CpuExecutor<T>> exec_, evalExec_;
  std::vector<ParamState<T>> params_;
  std::unique_ptr<BatchOrder> order_;
  int64_t stepsTaken_ = 0;
  cpu::AdamHyper hyper_;
  TrainResult res_;
};

template <class T>
CpuSession<T>::CpuSession(SessionSpec spec) : spec_(std::move(spec)) {
  Graph& g = spec_.train.graph;
  if (!spec_.dumpKernelsDir.empty()) {
    const int n = codegen::dumpKernels(g, spec_.dumpKernelsDir);
    if (spec_.announceCompile) std::printf("wrote %d CUDA kernels of the training step to %s\n", n, spec_.dumpKernelsDir.c_str());
  }
  exec_ = std::make_unique<CpuExecutor<T>>(g);
  evalExec_ = std::make_unique<CpuExecutor<T>>(spec_.validation.graph);
  int64_t paramCount = 0;
  for (ValueId pv : g.params()) {
    ParamState<T> p;
    p.name = g.value(pv).name;
    p.trainValue = pv;
    p.evalValue = spec_.validation.graph.findValue(p.name);
    p.grad = g.output(gradOutputName(p.name));
    const std::vector<double> init = spec_.initialValues(g, pv);
    assert(static_cast<int64_t>(init.size()) == numel(g.shape(pv)) && "the frontend checks given values");
    p.value.assign(init.begin(), init.end());
    p.m.assign(p.value.size(), T(0));
    p.v.assign(p.value.size(), T(0));
    paramCount += static_cast<int64_t>(p.value.size());
    params_.push_back(std::move(p));
  }
  for (ParamState<T>& p : params_) {
    exec_->bind(p.trainValue, p.value.data());
    if (p.evalValue != kNoValue) evalExec_->bind(p.evalValue, p.value.data());
  }
  awaitSessionData(spec_);  // the samples, last: a generated dataset may still be being made
  order_ = std::make_unique<BatchOrder>(spec_.trainData.count, spec_.seed, spec_.shuffle);
  const AdamSettings& a = spec_.adam;
  hyper_ = cpu::AdamHyper{a.lr, a.beta1, a.beta2, a.eps, a.weightDecay};
  res_.device = spec_.device;
  res_.parameterCount = paramCount;
  res_.trainNodes = g.liveNodeCount();
  res_.stepFlops = codegen::modelFlops(g);
  res_.activationBytes = exec_->arenaBytes();
}

template <class T>
TrainingState CpuSession<T>::state() const {
  TrainingState s;
  s.step = stepsTaken_;
  for (const ParamState<T>& p : params_) {
    s.params[p.name].assign(p.value.begin(), p.value.end());
    s.adamM[p.name].assign(p.m.begin(), p.m.end());
    s.adamV[p.name].assign(p.v.begin(), p.v.end());
  }
  s.order = order_->state();
  return s;
}

template <class T>
void CpuSession<T>::restore(const TrainingState& s) {
  const std::string why = order_->incompatibility(s.order);
  if (!why.empty()) throw UserError(why);
  for (ParamState<T>& p : params_) {
    auto copy = [&](const std::map<std::string, std::vector<double>>& from, std::vector<T>& to) {
      const std::vector<double>& v = from.at(p.name);
      assert(v.size() == to.size() && "the caller checks every size");
      std::copy(v.begin(), v.end(), to.begin());
    };
    copy(s.params, p.value);
    copy(s.adamM, p.m);
    copy(s.adamV, p.v);
  }
  order_->restore(s.order);
  stepsTaken_ = s.step;
}

template <class T>
double CpuSession<T>::validate() {
  const Samples& val = spec_.validationData;
  if (val.count == 0) return -1.0;
  const int64_t batch = spec_.validationBatch;
  const int64_t chunks = val.count / batch;  // the remainder (< one batch) is left out
  const int64_t xs = val.xSize, ys = val.ySize;
  T* ex = evalExec_->data(spec_.validation.x);
  T* ey = evalExec_->data(spec_.validation.y);
  const ValueId loss = spec_.validation.graph.output("loss");
  // With several ranks, rank r validates chunks r, r + size, ...; each chunk's loss reaches every
  // rank through a sum whose other terms are zeros, and the losses are added in chunk order, so
  // the result is the one process's to the bit.
  const int rank = spec_.comm ? spec_.comm->rank() : 0, ranks = spec_.comm ? spec_.comm->size() : 1;
  std::vector<double> losses(static_cast<size_t>(chunks), 0.0);
  for (int64_t c = rank; c < chunks; c += ranks) {
    const float* sx = val.x.data() + c * batch * xs;
    const float* sy = val.y.data() + c * batch * ys;
    std::copy(sx, sx + batch * xs, ex);
    std::copy(sy, sy + batch * ys, ey);
    evalExec_->run();
    losses[static_cast<size_t>(c)] = static_cast<double>(evalExec_->data(loss)[0]);
  }
  if (ranks > 1) spec_.comm->allReduceSum(losses.data(), losses.size());
  double acc = 0.0;
  for (double l : losses) acc += l;
  return acc / static_cast<double>(chunks);
}

template <class T>
double CpuSession<T>::averageOverRanks(double loss) {
  flat_.clear();
  for (const ParamState<T>& p : params_) {
    const T* gp = exec_->data(p.grad);
    flat_.insert(flat_.end(), gp, gp + p.value.size());
  }
  flat_.push_back(static_cast<T>(loss));
  spec_.comm->allReduceSum(flat_.data(), flat_.size());
  // Each rank's loss is the mean over its equal share of the batch, so the batch's mean loss and
  // its gradient are the means of the ranks'.
  const T scale = T(1) / static_cast<T>(spec_.comm->size());
  size_t at = 0;
  for (const ParamState<T>& p : params_) {
    T* gp = exec_->data(p.grad);
    for (size_t i = 0; i < p.value.size(); ++i) gp[i] = flat_[at + i] * scale;
    at += p.value.size();
  }
  return static_cast<double>(flat_[at] * scale);
}

template <class T>
double CpuSession<T>::runStep(int64_t step) {
  const Samples& data = spec_.trainData;
  const int64_t batch = spec_.batchSize;
  const int64_t xs = data.xSize, ys = data.ySize;
  const int64_t global = spec_.globalBatch > 0 ? spec_.globalBatch : batch;
  const int64_t* all = order_->next(global);
  const int64_t* rows = all + (spec_.comm ? spec_.comm->rank() : 0) * batch;
  ++stepsTaken_;
  if (spec_.recordBatches) batchLog_.insert(batchLog_.end(), all, all + global);
  T* xIn = exec_->data(spec_.train.x);
  T* yIn = exec_->data(spec_.train.y);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t s = rows[b];
    std::copy(data.x.begin() + s * xs, data.x.begin() + (s + 1) * xs, xIn + b * xs);
    std::copy(data.y.begin() + s * ys, data.y.begin() + (s + 1) * ys, yIn + b * ys);
  }
  exec_->run();
  double loss = static_cast<double>(exec_->data(spec_.train.graph.output("loss"))[0]);
  if (spec_.comm) loss = averageOverRanks(loss);
  if (!std::isfinite(loss)) return loss;  // the caller reports divergence; parameters stay as they were
  double gradScale = 1.0;
  const double clip = spec_.adam.clipGradNorm;
  if (clip > 0) {
    double sq = 0.0;
    for (const ParamState<T>& p : params_) {
      const T* gp = exec_->data(p.grad);
      for (size_t i = 0; i < p.value.size(); ++i) sq += static_cast<double>(gp[i]) * gp[i];
    }
    const double norm = std::sqrt(sq);
    if (norm > clip) gradScale = clip / norm;
  }
  hyper_.lr = spec_.schedule.at(step, spec_.steps);
  for (ParamState<T>& p : params_)
    cpu::adamStep(p.value.data(), exec_->data(p.grad), p.m.data(), p.v.data(), static_cast<int64_t>(p.value.size()),
                  hyper_, step, gradScale);
  return loss;
}

}  // namespace

std::unique_ptr<Session> makeCpuSession(SessionSpec spec) {
  switch (spec.precision) {
  case Precision::Fp64: return std::make_unique<CpuSession<double>>(std::move(spec));
  case Precision::Fp32:
  case Precision::Tf32:
  case Precision::Bf16: return std::make_unique<CpuSession<float>>(std::move(spec));
  }
  return nullptr;
}

}  // namespace pa
