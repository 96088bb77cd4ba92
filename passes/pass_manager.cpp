// Pass registry, pipeline validation and the driver that runs, verifies and dumps.
#include "passes/pass_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/debug.h"
#include "common/errors.h"
#include "graph/printer.h"
#include "graph/verifier.h"
#include "passes/autodiff.h"
#include "passes/dce.h"
#include "passes/fusion.h"

namespace pa {

namespace {

void registerBuiltins(PassRegistry& r) {
  r.add({"verify", "check ordering, dangling inputs and types", {}, {}, [](Graph& g, PassStats&, const PassTarget&) { verifyGraph(g); }});
  r.add({"dce", "remove nodes no graph output depends on", {}, {}, [](Graph& g, PassStats& s, const PassTarget&) {
           s.counters["nodes removed"] = eliminateDeadCode(g);
         }});
  // Fused ops carry their own gradients, so fusing the forward graph happens before autodiff;
  // fuse-elementwise and cse may run on either side of it.
  auto greedy = [](std::unique_ptr<RewritePattern> (*make)()) {
    return [make](Graph& g, PassStats& s, const PassTarget&) {
      std::vector<std::unique_ptr<RewritePattern>> ps;
      ps.push_back(make());
      s.counters["patterns matched"] = applyPatternsGreedily(g, ps);
    };
  };
  r.add({"fuse-linear", "MatMul -> Add(bias) -> ReLU | GELU become one FusedLinear; a SwiGLU's two projections one FusedLinear (swiglu)",
         {}, {"autodiff"}, [](Graph& g, PassStats& s, const PassTarget&) {
           std::vector<std::unique_ptr<RewritePattern>> ps;
           ps.push_back(makeFuseLinearPattern());
           s.counters["patterns matched"] = applyPatternsGreedily(g, ps);
           ps.clear();
           ps.push_back(makeFuseSwigluPattern());
           s.counters["swiglu pairs"] = applyPatternsGreedily(g, ps);
         }});
  r.add({"fuse-norm", "Add -> LayerNorm | RmsNorm (a residual add and the next norm) become one norm node that also writes the sum",
         {}, {"autodiff"}, greedy(&makeFuseNormPattern)});
  r.add({"fuse-linear-grad", "MatMul -> ReluGrad | GeluGrad in the backward become one MatMulActGrad", {"autodiff"},
         {"fuse-elementwise"}, greedy(&makeFuseLinearGradPattern)});
  r.add({"fuse-bias-grad", "a weight-gradient MatMul and its layer's bias-gradient SumTo become one MatMulBiasGrad",
         {"autodiff"}, {"fuse-elementwise"}, greedy(&makeFuseBiasGradPattern)});
  r.add({"fuse-loss", "MseLoss and its gradient (Sub, Scale, Mul) in the backward become one MseLossGrad", {"autodiff"},
         {"fuse-elementwise"}, greedy(&makeFuseLossGradPattern)});
  r.add({"fuse-mlp-train",
         "a FusedMlp, the MseLossGrad of its output and their FusedMlpGrad become one FusedMlpTrain (one kernel for the three)",
         {"autodiff", "fuse-loss"}, {"fuse-elementwise"}, greedy(&makeFuseMlpTrainPattern)});
  r.add({"fuse-attention",
         "softmax(Q·Kᵀ·scale + mask)·V becomes one FlashAttention, reading the heads' permutes in place", {},
         {"autodiff"}, [](Graph& g, PassStats& s, const PassTarget& target) {
           std::vector<std::unique_ptr<RewritePattern>> ps;
           ps.push_back(makeFuseAttentionPattern(target, &s.notes));
           s.counters["patterns matched"] = applyPatternsGreedily(g, ps);
           ps.clear();
           ps.push_back(makeFoldAttentionLayoutPattern());
           s.counters["layouts folded"] = applyPatternsGreedily(g, ps);
         }});
  r.add({"fuse-rope", "the rotary embedding of a FlashAttention's Q and K moves into their projections' GEMM epilogues",
         {"fuse-attention"}, {"autodiff"}, [](Graph& g, PassStats& s, const PassTarget&) {
           std::vector<std::unique_ptr<RewritePattern>> ps;
           ps.push_back(makeFoldRopePattern());
           s.counters["ropes folded"] = applyPatternsGreedily(g, ps);
         }});
  r.add({"fuse-qkv",
         "a FlashAttention's Q, K and V projections of one input become one GEMM over the concatenated weights, read packed",
         {"fuse-attention"}, {"autodiff"}, [](Graph& g, PassStats& s, const PassTarget&) {
           std::vector<std::unique_ptr<RewritePattern>> ps;
           ps.push_back(makeFuseQkvPattern());
           s.counters["qkv packed"] = applyPatternsGreedily(g, ps);
         }});
  r.add({"fuse-mlp", "a chain of FusedLinear layers at most 128 wide becomes one FusedMlp (one forward and one backward kernel) where its rows are few enough to pay",
         {"fuse-linear"}, {"autodiff"}, [](Graph& g, PassStats& s, const PassTarget& target) {
           std::vector<std::unique_ptr<RewritePattern>> ps;
           ps.push_back(makeFuseMlpPattern(target, &s.notes));
           s.counters["mlps fused"] = applyPatternsGreedily(g, ps);
         }});
  r.add({"fuse-elementwise", "chains of elementwise and broadcast ops become one FusedElementwise", {}, {},
         [](Graph& g, PassStats& s, const PassTarget&) {
           int64_t absorbed = 0;
           s.counters["patterns matched"] = fuseElementwise(g, absorbed);
           s.counters["ops absorbed"] = absorbed;
         }});
  r.add({"lower-bf16", "bf16 storage for activations and their gradients, casts before the GEMMs and attention (last: after fusion)",
         {}, {}, [](Graph& g, PassStats& s, const PassTarget&) { s.counters["casts inserted"] = lowerToBf16(g); }});
  r.add({"cse", "merge nodes computing the same op on the same inputs", {}, {}, [](Graph& g, PassStats& s, const PassTarget&) {
           s.counters["nodes removed"] = eliminateCommonSubexpressions(g);
         }});
  r.add({"autodiff", "append the backward graph of output 'loss' for every parameter", {}, {},
         [](Graph& g, PassStats& s, const PassTarget&) {
           const size_t before = g.liveNodeCount();
           appendBackward(g, g.output("loss"), g.params());
           s.counters["backward nodes"] = static_cast<int64_t>(g.liveNodeCount() - before);
         }});
}

}  // namespace

PassRegistry& PassRegistry::builtin() {
  static PassRegistry* r = [] {
    auto* reg = new PassRegistry;
    registerBuiltins(*reg);
    return reg;
  }();
  return *r;
}

void PassRegistry::add(PassInfo info) {
  if (passes_.count(info.name)) throw std::logic_error("pass '" + info.name + "' is registered twice");
  passes_[info.name] = std::move(info);
}

const PassInfo* PassRegistry::find(const std::string& name) const {
  auto it = passes_.find(name);
  return it == passes_.end() ? nullptr : &it->second;
}

std::vector<std::string> PassRegistry::names() const {
  std::vector<std::string> r;
  for (const auto& kv : passes_) r.push_back(kv.first);
  return r;
}

std::vector<std::string> forwardPassNames() {
  const PassRegistry& reg = PassRegistry::builtin();
  std::vector<std::string> r;
  for (const std::string& n : reg.names()) {
    const std::vector<std::string>& req = reg.find(n)->requires;
    if (n == "autodiff" || n == "lower-bf16" || std::find(req.begin(), req.end(), "autodiff") != req.end()) continue;
    r.push_back(n);
  }
  return r;
}

void validatePipeline(const std::vector<std::string>& names) {
  const PassRegistry& reg = PassRegistry::builtin();
  for (size_t i = 0; i < names.size(); ++i) {
    const PassInfo* p = reg.find(names[i]);
    if (!p) {
      std::string valid;
      for (const std::string& n : reg.names()) valid += (valid.empty() ? "" : ", ") + n;
      // compiler.passes is checked with its location and a suggestion when the config is read.
      throw UserError("unknown pass '" + names[i] + "'; valid passes: " + valid);
    }
    for (const std::string& req : p->requires)
      if (std::find(names.begin(), names.begin() + static_cast<long>(i), req) == names.begin() + static_cast<long>(i))
        throw UserError("pass '" + names[i] + "' needs pass '" + req + "' before it");
    for (const std::string& later : p->mustPrecede)
      if (std::find(names.begin(), names.begin() + static_cast<long>(i), later) != names.begin() + static_cast<long>(i))
        throw UserError("pass '" + names[i] + "' must run before pass '" + later + "'");
  }
}

void dumpGraph(const Graph& g, const std::string& dir, const std::string& stem, const std::string& title) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const fs::path base = fs::path(dir) / stem;
  std::ofstream(base.string() + ".txt") << graphToText(g, title);
  std::ofstream(base.string() + ".dot") << graphToDot(g, title);
  // SVG only where Graphviz is installed; its absence is not an error.
  if (std::system("command -v dot >/dev/null 2>&1") == 0) {
    const std::string cmd = "dot -Tsvg '" + base.string() + ".dot' -o '" + base.string() + ".svg' 2>/dev/null";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "note: dot failed to render %s.svg\n", base.c_str());
  }
}

std::vector<PassStats> runPipeline(Graph& g, const std::vector<std::string>& names, const PipelineOptions& opt) {
  validatePipeline(names);
  std::vector<PassStats> all;
  int index = opt.firstDumpIndex;
  for (const std::string& name : names) {
    PassStats s;
    s.pass = name;
    s.nodesBefore = g.liveNodeCount();
    PassRegistry::builtin().find(name)->run(g, s, opt.target);
    s.nodesAfter = g.liveNodeCount();
    if (opt.verifyEach && debugSwitches().verifyEachPass) verifyGraph(g);
    if (debugSwitches().printAfterEachPass)
      std::fprintf(stderr, "%s", graphToText(g, opt.title + " after " + name).c_str());
    if (!opt.dumpDir.empty()) {
      char stem[128];
      std::snprintf(stem, sizeof stem, "%02d-%s", ++index, name.c_str());
      dumpGraph(g, opt.dumpDir, stem, opt.title + " after " + name);
    }
    all.push_back(std::move(s));
  }
  return all;
}

}  // namespace pa
