// The config fuzzer's generator: valid tiny models, then mutations (see config_gen.h).
#include "tests/fuzz/config_gen.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace pa::fuzz {

namespace {

namespace fs = std::filesystem;

using Kind = YNode::Kind;

YNode S(const std::string& token) { return YNode::scalar(token); }
YNode I(int64_t v) { return YNode::scalar(std::to_string(v)); }
YNode B(bool v) { return YNode::scalar(v ? "true" : "false"); }
YNode L(std::initializer_list<int64_t> v) {
  YNode l = YNode::list();
  for (int64_t x : v) l.items.push_back(I(x));
  return l;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// ---- Seeds from configs/*.yaml ------------------------------------------------------------

bool isInt(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtoll(s.c_str(), &end, 10);
  return *end == '\0';
}

// Every integer above 16 under data and model becomes 8, one rule for all, so that equal
// extents stay equal (model.input [256, 256] with window 256 and 256 channels, horizon 256 with
// a last layer of 256 units) and every head count still divides the width.
void shrink(YNode& n, const std::string& path) {
  if (n.kind == Kind::Map) {
    for (auto& kv : n.entries) shrink(kv.second, path.empty() ? kv.first : path + "." + kv.first);
    return;
  }
  if (n.kind == Kind::List) {
    for (YNode& item : n.items) shrink(item, path);
    return;
  }
  int64_t v = 0;
  if (!isInt(n.token, v)) return;
  if (path == "data.samples") n.token = "64";
  else if (path == "train.batch_size") n.token = std::to_string(std::min<int64_t>(v, 8));
  else if (path == "train.steps") n.token = "2";
  else if (path == "train.log_every") n.token = "1";
  else if (path == "train.warmup_steps") n.token = std::to_string(std::min<int64_t>(v, 2));
  else if ((path.rfind("data", 0) == 0 || path.rfind("model", 0) == 0) && v > 16) n.token = "8";
}

// ---- Valid models ---------------------------------------------------------------------------

struct DataShape {
  YNode data;
  int64_t samples = 64;
  std::vector<int64_t> x, y;  // one sample
  std::string csv;            // the CSV file's text, for kind csv
};

double trainFraction(const YNode& data) {
  const YNode* v = data.find("validation");
  return v ? 1.0 - std::atof(v->token.c_str()) : 0.9;
}

void commonData(Rng& r, YNode& d, int64_t& samples) {
  samples = r.pick<int64_t>({24, 32, 48, 64, 96});
  d.set("samples", I(samples));
  if (r.percent(60)) d.set("validation", S(r.pick<std::string>({"0", "0.1", "0.25", "0.5"})));
  if (r.percent(20)) d.set("shuffle", B(r.percent(50)));
}

DataShape sineData(Rng& r, bool sequence) {
  DataShape s;
  s.data = YNode::map();
  s.data.set("kind", S("sine"));
  const int64_t w = r.range(1, 8), c = r.pick<int64_t>({1, 1, 2, 3, 4}), h = r.range(1, 3);
  s.data.set("window", I(w));
  if (c != 1 || r.percent(30)) s.data.set("channels", I(c));
  if (sequence || r.percent(70)) s.data.set("target", S(sequence ? "sequence" : "next"));
  if (!sequence && (h != 1 || r.percent(30))) s.data.set("horizon", I(h));
  if (sequence && r.percent(20)) s.data.set("horizon", I(h));
  if (r.percent(30)) s.data.set("noise", S(r.pick<std::string>({"0", "0.01", "0.5"})));
  if (r.percent(20)) s.data.set("period", L({2, r.range(2, 40)}));
  commonData(r, s.data, s.samples);
  s.x = {w, c};
  s.y = sequence ? std::vector<int64_t>{w, 1} : std::vector<int64_t>{h};
  return s;
}

DataShape functionData(Rng& r) {
  DataShape s;
  s.data = YNode::map();
  s.data.set("kind", S("function"));
  const int64_t in = r.range(1, 3);
  s.data.set("fn", S(r.pick<std::string>({"sin", "cos", "sinc", "gaussian", "cubic", "abs"})));
  if (in != 1 || r.percent(30)) s.data.set("inputs", I(in));
  if (r.percent(30)) s.data.set("range", YNode::list({S("-2"), S(r.pick<std::string>({"-1.5", "0", "3.5"}))}));
  if (r.percent(20)) s.data.set("noise", S("0.01"));
  commonData(r, s.data, s.samples);
  s.x = {in};
  s.y = {1};
  return s;
}

DataShape csvData(Rng& r) {
  DataShape s;
  s.data = YNode::map();
  s.data.set("kind", S("csv"));
  s.data.set("path", S("data.csv"));
  const int64_t cols = r.range(2, 4), rows = r.pick<int64_t>({16, 24, 40});
  const bool header = r.percent(80);
  if (!header || r.percent(20)) s.data.set("header", B(header));
  std::vector<std::string> names;
  for (int64_t c = 0; c < cols; ++c) names.push_back(header ? std::string(1, static_cast<char>('a' + c)) : "column" + std::to_string(c));
  int64_t nTargets = 1;
  if (r.percent(30)) {  // name the columns explicitly
    nTargets = cols > 2 && r.percent(40) ? 2 : 1;
    YNode f = YNode::list(), t = YNode::list();
    for (int64_t c = 0; c < cols; ++c) (c < cols - nTargets ? f : t).items.push_back(S(names[static_cast<size_t>(c)]));
    s.data.set("features", f);
    s.data.set("targets", nTargets == 1 && r.percent(50) ? t.items[0] : t);
  }
  std::string text;
  if (header) {
    for (int64_t c = 0; c < cols; ++c) text += (c ? "," : "") + names[static_cast<size_t>(c)];
    text += "\n";
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) text += (c ? "," : "") + fmt(std::sin(0.37 * static_cast<double>(i * (c + 1))));
    text += "\n";
  }
  s.csv = text;
  s.samples = rows;
  if (r.percent(40)) s.data.set("validation", S(r.pick<std::string>({"0", "0.25"})));
  s.x = {cols - nTargets};
  s.y = {nTargets};
  return s;
}

const std::vector<std::string> kActivations = {"relu", "gelu", "tanh", "sigmoid", "none"};

YNode linear(Rng& r, int64_t units, bool last) {
  YNode l = YNode::map();
  l.set("units", I(units));
  if (!last || r.percent(20)) {
    const std::string a = r.pick(kActivations);
    if (a != "none" || r.percent(30)) l.set("activation", S(a));
  }
  if (r.percent(15)) l.set("bias", B(r.percent(50)));
  YNode item = YNode::map();
  item.set("linear", l);
  return item;
}

YNode attention(Rng& r, int64_t width, int64_t seq) {
  YNode a = YNode::map();
  std::vector<int64_t> heads;
  for (int64_t h : {1, 2, 4})
    if (width % h == 0) heads.push_back(h);
  int64_t h = r.pick(heads);
  if (r.percent(15)) {  // any head count with an explicit head_dim
    h = r.range(1, 4);
    a.set("head_dim", I(r.range(1, 5)));
  }
  if (h != 1 || r.percent(50)) a.set("heads", I(h));
  std::vector<int64_t> kv;
  for (int64_t k = 1; k <= h; ++k)
    if (h % k == 0) kv.push_back(k);
  if (r.percent(50)) a.set("kv_heads", I(r.pick(kv)));
  if (r.percent(60)) a.set("causal", B(r.percent(80)));
  if (r.percent(20)) a.set("align", S(r.percent(50) ? "top-left" : "bottom-right"));
  const int w = static_cast<int>(r.below(5));
  if (w == 1) a.set("window", I(r.range(0, seq + 1)));
  if (w >= 2) {
    YNode win = YNode::map();
    if (w != 3) win.set("left", I(r.range(0, seq + 1)));
    if (w != 2) win.set("right", I(r.range(0, seq + 1)));
    a.set("window", win);
  }
  if (r.percent(40)) a.set("sinks", I(r.range(0, 3)));
  if (r.percent(40)) a.set("sink_logits", B(r.percent(70)));
  if (r.percent(50)) a.set("residual", B(r.percent(70)));
  YNode item = YNode::map();
  item.set("attention", a);
  return item;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

YNode ints(const std::vector<int64_t>& v) {
  YNode l = YNode::list();
  for (int64_t x : v) l.items.push_back(I(x));
  return l;
}

// An MLP over any data: flat input, hidden layers, last layer to the target's width.
YNode mlpModel(Rng& r, const DataShape& d) {
  YNode m = YNode::map();
  const bool sequence = d.y.size() == 2;
  if (sequence) m.set("input", ints(d.x));
  else if (d.x.size() > 1 || r.percent(30)) m.set("input", ints({numel(d.x)}));
  YNode layers = YNode::list();
  const int64_t hidden = r.range(0, 3);
  for (int64_t i = 0; i < hidden; ++i) layers.items.push_back(linear(r, r.pick<int64_t>({1, 2, 4, 8}), false));
  layers.items.push_back(linear(r, sequence ? 1 : numel(d.y), true));
  m.set("layers", layers);
  return m;
}

// Attention over a sine sequence: [window, channels] -> optional linear -> 1-2 attention layers
// (with an MLP between) -> one value per position.
YNode attentionModel(Rng& r, const DataShape& d) {
  YNode m = YNode::map();
  m.set("input", ints(d.x));
  YNode layers = YNode::list();
  int64_t width = d.x[1];
  if (r.percent(70)) {
    width = r.pick<int64_t>({2, 4, 8});
    layers.items.push_back(linear(r, width, false));
  }
  const int64_t n = r.percent(25) ? 2 : 1;
  for (int64_t i = 0; i < n; ++i) {
    layers.items.push_back(attention(r, width, d.x[0]));
    if (r.percent(30)) {
      width = r.pick<int64_t>({2, 4});
      layers.items.push_back(linear(r, width, false));
    }
  }
  layers.items.push_back(linear(r, 1, true));
  m.set("layers", layers);
  return m;
}

YNode node(const std::string& op, std::vector<std::string> inputs, const std::string& output) {
  YNode n = YNode::map();
  n.set("op", S(op));
  YNode in = YNode::list();
  for (const std::string& s : inputs) in.items.push_back(S(s));
  n.set("inputs", in);
  n.set("output", S(output));
  return n;
}

YNode param(std::vector<int64_t> shape, Rng& r) {
  YNode p = YNode::map();
  p.set("shape", ints(shape));
  if (r.percent(50)) p.set("init", S(r.pick<std::string>({"he", "xavier", "zeros", "ones", "normal"})));
  return p;
}

// Explicit params + nodes: a two-layer MLP with any activation.
YNode explicitMlp(Rng& r, const DataShape& d) {
  YNode m = YNode::map();
  const int64_t in = numel(d.x), out = numel(d.y), hidden = r.pick<int64_t>({2, 4, 8});
  m.set("input", ints({in}));
  YNode ps = YNode::map(), ns = YNode::list();
  ps.set("w1", param({in, hidden}, r));
  ps.set("b1", param({hidden}, r));
  ps.set("w2", param({hidden, out}, r));
  ns.items.push_back(node("matmul", {"input", "w1"}, "h"));
  ns.items.push_back(r.percent(50) ? node("add", {"h", "b1"}, "h1") : node("add", {"b1", "h"}, "h1"));
  const std::string act = r.pick<std::string>({"relu", "gelu", "tanh", "sigmoid", "exp"});
  ns.items.push_back(node(act, {"h1"}, "h2"));
  ns.items.push_back(node("matmul", {"h2", "w2"}, "y"));
  m.set("params", ps);
  m.set("nodes", ns);
  if (r.percent(30)) m.set("output", S("y"));
  return m;
}

// Explicit single-head attention over a sine sequence, written by hand with primitive ops.
YNode explicitAttention(Rng& r, const DataShape& d) {
  YNode m = YNode::map();
  const int64_t seq = d.x[0], c = d.x[1], dim = r.pick<int64_t>({2, 4});
  m.set("input", ints(d.x));
  YNode ps = YNode::map(), ns = YNode::list();
  for (const char* w : {"wq", "wk", "wv"}) ps.set(w, param({c, dim}, r));
  ps.set("wo", param({dim, 1}, r));
  ns.items.push_back(node("matmul", {"input", "wq"}, "q"));
  ns.items.push_back(node("matmul", {"input", "wk"}, "k"));
  ns.items.push_back(node("matmul", {"input", "wv"}, "v"));
  if (r.percent(50)) {
    YNode s = node("matmul", {"q", "k"}, "s");
    s.set("transpose_b", B(true));
    ns.items.push_back(s);
  } else {
    YNode kt = node("permute", {"k"}, "kt");
    kt.set("perm", L({0, 2, 1}));
    ns.items.push_back(kt);
    ns.items.push_back(node("matmul", {"q", "kt"}, "s"));
  }
  YNode sc = node("scale", {"s"}, "s1");
  sc.set("value", S(fmt(1.0 / std::sqrt(static_cast<double>(dim)))));
  ns.items.push_back(sc);
  std::string scores = "s1";
  if (r.percent(70)) {
    YNode mask = node("attention-mask", {"s1"}, "s2");
    mask.set("causal", B(r.percent(80)));
    if (r.percent(40)) mask.set("window_left", I(r.range(0, seq)));
    if (r.percent(20)) mask.set("window_right", I(r.range(0, seq)));
    if (r.percent(30)) mask.set("sinks", I(r.range(0, 2)));
    if (r.percent(20)) mask.set("align", S("bottom-right"));
    ns.items.push_back(mask);
    scores = "s2";
  }
  if (r.percent(25)) {
    ps.set("sink", param({1}, r));
    YNode sm = node("softmax", {scores, "sink"}, "p");
    ns.items.push_back(sm);
  } else {
    YNode sm = node("softmax", {scores}, "p");
    if (r.percent(30)) sm.set("axis", I(-1));
    ns.items.push_back(sm);
  }
  ns.items.push_back(node("matmul", {"p", "v"}, "o"));
  ns.items.push_back(node("matmul", {"o", "wo"}, "y"));
  m.set("params", ps);
  m.set("nodes", ns);
  return m;
}

YNode trainSection(Rng& r, int64_t trainSamples) {
  YNode t = YNode::map();
  int64_t batch = r.pick<int64_t>({1, 2, 4, 8, 16});
  batch = std::max<int64_t>(1, std::min(batch, trainSamples));
  t.set("batch_size", I(batch));
  // train.steps or train.epochs, not both (README: both in one file are refused).
  if (r.percent(10)) t.set("epochs", I(r.range(0, 2)));
  else t.set("steps", I(2));
  if (r.percent(50)) t.set("log_every", I(r.range(1, 2)));
  if (r.percent(60)) {
    YNode o = YNode::map();
    if (r.percent(30)) o.set("type", S("adam"));
    o.set("lr", S(r.pick<std::string>({"1.0e-3", "0.01", "0", "3e-4"})));
    if (r.percent(30)) o.set("betas", YNode::list({S("0.9"), S(r.pick<std::string>({"0.999", "0.95", "0"}))}));
    // Not 0: Adam with eps 0 divides 0 by 0 for a parameter whose gradient is 0 (a zero-initialised
    // layer), and the loss becomes NaN (exit 1), as in PyTorch.
    if (r.percent(20)) o.set("eps", S(r.pick<std::string>({"1e-8", "1e-3", "0.1"})));
    if (r.percent(20)) o.set("weight_decay", S(r.pick<std::string>({"0", "0.01", "1"})));
    if (r.percent(20)) o.set("clip_grad_norm", S(r.pick<std::string>({"0", "1.0", "1e-6"})));
    t.set("optimizer", o);
  }
  if (r.percent(20)) t.set("lr_schedule", S(r.percent(50) ? "cosine" : "constant"));
  if (r.percent(20)) t.set("warmup_steps", I(r.range(0, 3)));
  if (r.percent(10)) t.set("loss", S("mse"));
  return t;
}

YNode compilerSection(Rng& r) {
  YNode c = YNode::map();
  const int f = static_cast<int>(r.below(4));
  if (f == 0) c.set("fuse", B(true));
  if (f == 1) c.set("fuse", B(false));
  if (f == 2) {
    YNode l = YNode::list();
    for (const char* k : {"linear", "attention", "elementwise"})
      if (r.percent(60)) l.items.push_back(S(k));
    c.set("fuse", l);
  }
  if (r.percent(30)) {
    YNode p = YNode::list();
    for (const char* k : {"cse", "dce"})
      if (r.percent(60)) p.items.push_back(S(k));
    c.set("passes", p);
  }
  if (r.percent(10)) c.set("gemm", S(r.pick<std::string>({"auto", "generated", "cublaslt"})));
  if (r.percent(10)) c.set("deterministic", B(r.percent(50)));
  return c;
}

// One valid model from the generator; `csv` gets the data file's text when it needs one.
YNode generated(Rng& r, std::string& origin, std::string& csv) {
  const int kind = static_cast<int>(r.below(4));
  DataShape d;
  YNode model;
  if (kind == 0) {
    const int src = static_cast<int>(r.below(4));
    d = src == 0 ? sineData(r, false) : src == 1 ? sineData(r, true) : src == 2 ? functionData(r) : csvData(r);
    model = mlpModel(r, d);
    origin = "generated mlp";
  } else if (kind == 1) {
    d = sineData(r, true);
    model = attentionModel(r, d);
    origin = "generated attention";
  } else if (kind == 2) {
    d = r.percent(50) ? functionData(r) : csvData(r);
    model = explicitMlp(r, d);
    origin = "generated explicit mlp";
  } else {
    d = sineData(r, true);
    model = explicitAttention(r, d);
    origin = "generated explicit attention";
  }
  csv = d.csv;
  YNode root = YNode::map();
  root.set("name", S("fuzz"));
  if (r.percent(30)) root.set("seed", I(r.range(0, 3)));
  if (r.percent(20)) root.set("device", S(r.pick<std::string>({"auto", "cpu", "cuda"})));
  if (r.percent(50)) root.set("precision", S(r.pick<std::string>({"fp32", "fp64", "tf32", "bf16"})));
  root.set("data", d.data);
  root.set("model", model);
  const int64_t trainSamples = static_cast<int64_t>(std::floor(static_cast<double>(d.samples) * trainFraction(d.data)));
  root.set("train", trainSection(r, trainSamples));
  if (r.percent(70)) root.set("compiler", compilerSection(r));
  return root;
}

// ---- Mutations --------------------------------------------------------------------------

const std::vector<std::string> kNumbers = {
    "0", "-1", "1", "2", "3", "5", "7", "16", "33", "1000000000000", "1e12", "9e18", "9000000000000000000",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551617", "2147483648",
    "4294967297", "100000000", "65537", "1e308", "-1e308", "1e400", "4.9e-324", "1e-45", ".nan", ".NaN", "nan",
    ".inf", "-.inf", "inf", "-inf", "-0", "-0.0", "0.5", "-0.5", "1.5", "0x10", "0o17", "1_000", "+1", "1.", ".5",
    "010"};
const std::vector<std::string> kSmallInts = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "12", "16", "17", "31", "64", "100"};
const std::vector<std::string> kStrings = {
    "\"\"", "~", "null", "true", "false", "yes", "no", "abc", "\"\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80\"", "\"\\0\"",
    "\"a\\tb\\nc\"", "'single'", "\"\\u202e\"", "relu", "linear", "attention", "sine", "csv", "\"1\"", "\" 1\"",
    "\"1 \"", "!!str 1", "!!float .nan", "!!binary aGVsbG8=", "\"\xff\xfe\"", "\"\\U0001F600\""};
const std::vector<std::string> kStructures = {
    "[]", "{}", "[1, 2]", "[1]", "[0]", "[-1]", "{a: 1}", "[[]]", "[.nan, .inf]", "[1, -1]", "[9e18, 1]",
    "[1, 2, 3]", "{left: -1}", "[a, b]", "{units: 8}", "[{linear: {units: 1}}]", "[2, 1]", "[1000000000000, 1000000000000]"};
const std::vector<std::string> kKnownKeys = {
    "name", "seed", "device", "precision", "data", "model", "train", "compiler", "kind", "samples", "window", "horizon",
    "channels", "target", "period", "fn", "inputs", "range", "path", "features", "targets", "header", "validation",
    "shuffle", "noise", "input", "layers", "params", "nodes", "output", "linear", "attention", "units", "activation",
    "bias", "heads", "kv_heads", "head_dim", "causal", "align", "window_left", "window_right", "sinks", "sink_logits",
    "residual", "op", "shape", "init", "perm", "axis", "axes", "value", "transpose_a", "transpose_b", "repeats",
    "expr", "layout", "fill", "keepdims", "dtype", "data", "loss", "optimizer", "lr", "betas", "eps", "weight_decay",
    "clip_grad_norm", "batch_size", "steps", "epochs", "log_every", "lr_schedule", "warmup_steps", "fuse", "passes",
    "gemm", "deterministic", "type", "mlp", "norm", "position", "repeat", "hidden", "rope", "pre_norm", "post_norm", "times",
    "overrides", "base", "dims", "interleaved", "delay", "part", "inverse"};
// Op names and attribute values a hand-written node may use, valid or not.
const std::vector<std::string> kOps = {
    "constant", "matmul", "add", "sub", "mul", "div", "scale", "relu", "gelu", "tanh", "sigmoid", "exp", "softmax",
    "permute", "reshape", "broadcast-to", "sum", "mean", "sum-to", "attention-mask", "repeat-heads", "mse-loss",
    "cast", "fused-linear", "flash-attention", "fused-elementwise", "relu-grad", "gelu-grad", "tanh-grad",
    "sigmoid-grad", "softmax-grad", "softmax-sink-grad", "flash-attention-grad", "matmul-act-grad", "input", "param",
    "silu", "gelu-tanh", "layer-norm", "rms-norm", "rope", "interleave", "deinterleave", "swiglu-grad", "layer-norm-grad",
    "nope"};

std::string anyValue(Rng& r) {
  const int k = static_cast<int>(r.below(10));
  if (k < 4) return r.pick(kNumbers);
  if (k < 6) return r.pick(kSmallInts);
  if (k < 8) return r.pick(kStrings);
  return r.pick(kStructures);
}

struct Slot {
  YNode* parent;
  size_t index;
  std::string path;  // dotted, list items by index: the form --set takes
};

void collect(YNode& n, const std::string& path, std::vector<Slot>& out) {
  if (n.kind == Kind::Map)
    for (size_t i = 0; i < n.entries.size(); ++i) {
      const std::string p = path.empty() ? n.entries[i].first : path + "." + n.entries[i].first;
      out.push_back({&n, i, p});
      collect(n.entries[i].second, p, out);
    }
  if (n.kind == Kind::List)
    for (size_t i = 0; i < n.items.size(); ++i) {
      const std::string p = path + "." + std::to_string(i);
      out.push_back({&n, i, p});
      collect(n.items[i], p, out);
    }
}

YNode& valueOf(const Slot& s) {
  return s.parent->kind == Kind::Map ? s.parent->entries[s.index].second : s.parent->items[s.index];
}

std::string typo(Rng& r, std::string k) {
  if (k.empty()) return "x";
  const size_t at = r.below(k.size());
  switch (r.below(5)) {
    case 0: return k.erase(at, 1);
    case 1: return k.insert(at, 1, static_cast<char>('a' + r.below(26)));
    case 2: k[at] = static_cast<char>(std::toupper(static_cast<unsigned char>(k[at]))); return k;
    case 3: return k + "_";
    default: return k + "s";
  }
}

std::string deep(Rng& r) {
  const size_t depth = r.pick<size_t>({8, 64, 300, 1500, 5000});
  if (r.percent(50)) return std::string(depth, '[') + "1" + std::string(depth, ']');
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += "{a: ";
  return s + "1" + std::string(depth, '}');
}

// Attribute values for hand-written nodes: valid ones and the edges of each.
const std::vector<std::pair<std::string, std::vector<std::string>>> kAttrs = {
    {"perm", {"[0, 2, 1]", "[0, 1, 2]", "[5, 0, 1]", "[0, 0, 1]", "[-1, 0, 1]", "[]", "[0, 2, 1, 3]", "[1, 0]"}},
    {"shape", {"[-1]", "[-1, -1]", "[0]", "[2, -1]", "[1000000000000, 1000000000000]", "[]", "[1]", "[-1, 4]", "[-2, 4]", "[8, 8, 8]"}},
    {"axes", {"[5]", "[-7]", "[0, 0]", "[]", "[1]", "[-1]", "[0, 1, 2]"}},
    {"axis", {"5", "-5", "0", "1", "-1", "2", "9223372036854775807"}},
    {"repeats", {"0", "-1", "2", "3", "1000000000000"}},
    {"value", {".nan", "0", "-1", "1e38", "2", ".inf"}},
    {"expr", {"relu(add($0, $1))", "$5", "add($0)", "((", "\"\"", "sub($0, $0)", "$0", "exp(exp(exp($0)))", "div($0, $1)",
              "mul($0, $0, $0)", "$-1", "$99999999999999999999", "relu(", "nope($0)", "add($0, 1)", "tanh(sigmoid(gelu($0)))"}},
    {"dtype", {"bf16", "f32", "f16", "x"}},
    {"window_left", {"-5", "0", "1", "9000000000000000000", "-1"}},
    {"window_right", {"-5", "0", "2", "-1", "9000000000000000000"}},
    {"sinks", {"-1", "100", "1", "9000000000000000000"}},
    {"fill", {".nan", "0", "-.inf", ".inf"}},
    {"causal", {"true", "1", "maybe"}},
    {"align", {"x", "bottom-right", "top-left"}},
    {"layout", {"bshd", "bhsd", "x"}},
    {"activation", {"gelu", "relu", "x", "none"}},
    {"transpose_a", {"true", "false"}},
    {"transpose_b", {"true", "2"}},
    {"transpose_w", {"true"}},
    {"keepdims", {"true"}},
    {"scale", {"0.5", ".nan", "0"}},
    {"data", {"[1, 2, 3]", "[.nan]", "[-.inf, 0]", "[]", "[1, 2, 3, 4, 5, 6, 7, 8]"}},
};

// Names a hand-written node may take as inputs: the graph's input, parameters, earlier outputs.
std::vector<std::string> valueNames(const YNode& model, size_t before) {
  std::vector<std::string> names = {"input"};
  if (const YNode* ps = model.find("params"))
    for (const auto& kv : ps->entries) names.push_back(kv.first);
  if (const YNode* ns = model.find("nodes"))
    for (size_t i = 0; i < ns->items.size() && i < before; ++i)
      if (const YNode* o = ns->items[i].find("output")) names.push_back(o->token);
  return names;
}

// A random node (any op, any inputs, a few attributes) into an explicit graph; often it becomes
// the output, so that shape inference, the kernels and autodiff all see it.
std::string randomNode(Rng& r, YNode& model) {
  YNode* ns = model.find("nodes");
  if (!ns || ns->kind != Kind::List) return "";
  const size_t at = r.below(ns->items.size() + 1);
  const std::vector<std::string> names = valueNames(model, at);
  YNode n = YNode::map();
  const std::string op = r.pick(kOps);
  n.set("op", S(op));
  YNode in = YNode::list();
  const int64_t k = r.pick<int64_t>({0, 1, 1, 2, 2, 3, 4});
  for (int64_t i = 0; i < k; ++i) in.items.push_back(S(r.pick(names)));
  n.set("inputs", in);
  const std::string out = "z" + std::to_string(r.below(1000));
  n.set("output", S(out));
  std::string what = "node " + op + emitFlow(in);
  for (int64_t i = r.range(0, 3); i > 0; --i) {
    const auto& a = r.pick(kAttrs);
    n.set(a.first, S(r.pick(a.second)));
    what += " " + a.first + "=" + n.find(a.first)->token;
  }
  ns->items.insert(ns->items.begin() + static_cast<std::ptrdiff_t>(at), n);
  if (r.percent(60)) {
    model.set("output", S(out));
    what += " as output";
  }
  return what + " at " + std::to_string(at);
}

// A layer or mask setting that still parses but may not fit the shapes: heads that do not divide
// the width, windows and sinks beyond the sequence, odd head dims, more layers.
std::string layerMutation(Rng& r, YNode& model) {
  YNode* ls = model.find("layers");
  if (!ls || ls->kind != Kind::List || ls->items.empty()) return "";
  YNode& item = ls->items[r.below(ls->items.size())];
  if (item.kind != Kind::Map || item.entries.empty() || item.entries[0].second.kind != Kind::Map) return "";
  YNode& l = item.entries[0].second;
  static const std::vector<std::string> kAttentionKeys = {"heads", "kv_heads", "head_dim", "window", "sinks", "causal",
                                                         "align", "sink_logits", "residual", "rope", "pre_norm", "post_norm", "bias"};
  if (item.entries[0].first == "attention") {
    const std::string key = r.pick(kAttentionKeys);
    std::string v;
    if (key == "causal" || key == "sink_logits" || key == "residual" || key == "bias") v = r.percent(50) ? "true" : "false";
    else if (key == "rope") v = r.pick<std::string>({"true", "{dims: 2}", "{dims: 3}", "{base: 0}", "{interleaved: true, dims: 4}", "{dims: 4096}"});
    else if (key == "pre_norm" || key == "post_norm") v = r.pick<std::string>({"rms", "layer", "{kind: rms, eps: 0}", "batch", "{eps: 1}"});
    else if (key == "align") v = r.percent(50) ? "bottom-right" : "top-left";
    else if (key == "window" && r.percent(50)) v = r.pick<std::string>({"{left: 0, right: 0}", "{right: 100}", "{left: 100, right: 100}", "{}", "{left: 9000000000000000000}", "0"});
    else v = r.pick<std::string>({"1", "2", "3", "5", "6", "7", "8", "9", "16", "64", "100", "4096", "65536"});
    l.set(key, S(v));
    return "attention " + key + " = " + v;
  }
  const int k = static_cast<int>(r.below(4));
  if (k == 3) {  // a transformer layer: norm, mlp, position, or a repeated block
    const std::string yaml = r.pick<std::string>(
        {"{norm: rms}", "{norm: {kind: layer, eps: 1.0e-3}}", "{mlp: {hidden: 5, activation: swiglu, residual: true, pre_norm: rms}}",
         "{mlp: {hidden: 3, activation: gelu_tanh, post_norm: layer}}", "{position: {kind: sinusoidal}}", "{position: {kind: learned}}",
         "{repeat: {times: 2, layers: [{attention: {heads: 1, causal: true, rope: true, pre_norm: rms, residual: true}}, "
         "{mlp: {hidden: 4, activation: swiglu, residual: true}}], overrides: [{attention: {window: 1}}, {}]}}",
         "{repeat: {times: 3, layers: [{norm: rms}, {linear: {units: 2}}]}}"});
    ls->items.insert(ls->items.begin() + static_cast<std::ptrdiff_t>(r.below(ls->items.size() + 1)), YNode::scalar(yaml));
    return "transformer layer inserted: " + yaml;
  }
  if (k == 0) {
    const std::string v = r.pick<std::string>({"1", "3", "5", "64", "1000", "100000"});
    l.set("units", S(v));
    return "linear units = " + v;
  }
  if (k == 1) {
    YNode a = YNode::map();
    a.set("heads", S(r.pick<std::string>({"1", "2", "3", "4"})));
    if (r.percent(50)) a.set("causal", B(true));
    if (r.percent(30)) a.set("sink_logits", B(true));
    YNode att = YNode::map();
    att.set("attention", a);
    ls->items.insert(ls->items.begin() + static_cast<std::ptrdiff_t>(r.below(ls->items.size() + 1)), att);
    return "attention layer inserted";
  }
  l.set("activation", S(r.pick(kActivations)));
  return "linear activation changed";
}

// One mutation of the tree; returns what it did.
std::string mutateTree(Rng& r, YNode& root) {
  std::vector<Slot> slots;
  collect(root, "", slots);
  if (slots.empty()) {
    root = YNode::scalar(anyValue(r));
    return "root := " + root.token;
  }
  // Mostly leaves and the keys near them: that is where the values live.
  const Slot s = r.pick(slots);
  YNode& v = valueOf(s);
  const bool inMap = s.parent->kind == Kind::Map;
  switch (r.below(12)) {
    case 0: {
      if (inMap) s.parent->entries.erase(s.parent->entries.begin() + static_cast<std::ptrdiff_t>(s.index));
      else s.parent->items.erase(s.parent->items.begin() + static_cast<std::ptrdiff_t>(s.index));
      return "delete " + s.path;
    }
    case 1: {
      if (inMap) {
        auto copy = s.parent->entries[s.index];
        if (r.percent(50) && copy.second.isScalar()) copy.second.token = anyValue(r);
        s.parent->entries.insert(s.parent->entries.begin() + static_cast<std::ptrdiff_t>(s.index) + 1, copy);
      } else {
        const YNode copy = v;
        const size_t times = r.pick<size_t>({1, 1, 3, 40});
        s.parent->items.insert(s.parent->items.begin() + static_cast<std::ptrdiff_t>(s.index) + 1, times, copy);
      }
      return "duplicate " + s.path;
    }
    case 2: {
      if (!inMap) break;
      std::string& key = s.parent->entries[s.index].first;
      const int k = static_cast<int>(r.below(6));
      key = k < 2 ? typo(r, key)
            : k < 4 ? plainOrQuoted(r.pick(kKnownKeys))
            : k == 4 ? r.pick<std::string>({"\"\"", "\"\xc3\xa9t\xc3\xa9\"", "\"a.b\"", "1", "~", "[a]", "\"" + std::string(300, 'k') + "\""})
                     : "\"" + std::string("\xe2\x80\x8b") + key + "\"";
      return "rename " + s.path + " -> " + key;
    }
    case 3:
    case 4: {
      if (v.isScalar() && r.percent(50)) {
        v.token = r.percent(50) ? r.pick(kNumbers) : r.pick(kSmallInts);
      } else {
        v = YNode::scalar(anyValue(r));
      }
      return "set " + s.path + " = " + emitFlow(v);
    }
    case 5: {  // wrong type: a map, a list or a scalar where another kind is
      if (v.kind == Kind::Map) v = r.percent(50) ? YNode::list({v.entries.empty() ? S("1") : v.entries[0].second}) : S(r.pick(kNumbers));
      else if (v.kind == Kind::List) v = r.percent(50) ? (v.items.empty() ? S("[]") : v.items[0]) : YNode::map();
      else {
        YNode m = YNode::map();
        m.set(r.pick(kKnownKeys), v);
        v = r.percent(50) ? m : YNode::list({v});
      }
      return "retype " + s.path + " = " + emitFlow(v);
    }
    case 6:
      v = S(r.pick(kStrings));
      return "set " + s.path + " = " + v.token;
    case 7:
      v = S(deep(r));
      return "nest " + s.path + " deeply";
    case 8: {  // a key that is valid somewhere else, or nowhere
      YNode* m = v.kind == Kind::Map ? &v : s.parent->kind == Kind::Map ? s.parent : &root;
      if (m->kind != Kind::Map) break;
      const std::string key = r.percent(80) ? r.pick(kKnownKeys) : typo(r, r.pick(kKnownKeys));
      m->entries.emplace_back(key, S(anyValue(r)));
      return "add key " + key + " at " + s.path;
    }
    case 9:
      v = S(r.pick(kStructures));
      return "set " + s.path + " = " + v.token;
    case 10: {  // a different op or a small integer: mistakes that still parse
      if (s.path.find(".op") != std::string::npos || (inMap && s.parent->entries[s.index].first == "op")) {
        v = S(r.pick(kOps));
      } else if (v.isScalar()) {
        v.token = r.pick(kSmallInts);
      } else {
        break;
      }
      return "set " + s.path + " = " + v.token;
    }
    default: {  // an extent list or a list value grows, shrinks or empties
      if (v.kind != Kind::List) {
        v = S(r.pick(kSmallInts));
        return "set " + s.path + " = " + v.token;
      }
      const int k = static_cast<int>(r.below(3));
      if (k == 0) v.items.clear();
      else if (k == 1) v.items.push_back(S(r.pick(kSmallInts)));
      else if (!v.items.empty()) v.items.pop_back();
      return "resize list " + s.path + " to " + std::to_string(v.items.size());
    }
  }
  v = S(anyValue(r));
  return "set " + s.path + " = " + v.token;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> r;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) r.push_back(l);
  return r;
}

std::string joinLines(const std::vector<std::string>& ls, const std::string& eol = "\n") {
  std::string r;
  for (const std::string& l : ls) r += l + eol;
  return r;
}

// One mutation of the YAML text itself (what the tree cannot express).
std::string mutateText(Rng& r, std::string& text) {
  static const std::vector<std::string> kSnippets = {
      "\t", ":", "{", "}", "[", "]", "\"", "'", "&a ", "*a", "*", "!!binary ", "!!int ", "%YAML 1.2\n---\n",
      "\n---\n", "\n...\n", "? ", "- ", "#", "|\n", ">\n", "<<: *a\n", "\xff", "\xef\xbb\xbf", "\r\n", std::string(1, '\0'),
      ",", "&a [*a]", "!<tag:x> ", "\\", "\xc3", "%TAG ! tag:x,2000:\n"};
  std::vector<std::string> ls = lines(text);
  const size_t at = ls.empty() ? 0 : r.below(ls.size());
  switch (r.below(7)) {
    case 0: {
      const size_t cut = r.below(text.size() + 1);
      text = text.substr(0, cut);
      return "truncate at byte " + std::to_string(cut);
    }
    case 1:
    case 2: {
      const size_t pos = r.below(text.size() + 1);
      const std::string& snip = r.pick(kSnippets);
      text.insert(pos, snip);
      return "insert " + plainOrQuoted(snip) + " at byte " + std::to_string(pos);
    }
    case 3:
      if (!ls.empty()) ls.erase(ls.begin() + static_cast<std::ptrdiff_t>(at));
      text = joinLines(ls);
      return "delete line " + std::to_string(at + 1);
    case 4:
      if (!ls.empty()) ls.insert(ls.begin() + static_cast<std::ptrdiff_t>(at), ls[at]);
      text = joinLines(ls);
      return "duplicate line " + std::to_string(at + 1);
    case 5:
      if (!ls.empty()) ls[at] = (r.percent(50) ? " " : "") + (ls[at].empty() || r.percent(50) ? ls[at] : ls[at].substr(1));
      text = joinLines(ls);
      return "reindent line " + std::to_string(at + 1);
    default: {  // an anchor on one value, an alias to it on another
      text = joinLines(ls, r.percent(20) ? "\r\n" : "\n");
      const size_t colon = text.find(": ", r.below(text.size() + 1));
      if (colon == std::string::npos) return "line endings";
      text.insert(colon + 2, r.percent(50) ? "&x " : "*x\n#");
      return "anchor/alias at byte " + std::to_string(colon + 2);
    }
  }
}

std::string mutateCsv(Rng& r, std::string& csv) {
  static const std::vector<std::string> kCells = {"nan", "inf", "-inf", "1e39", "-1e39", "abc", "", " 1", "1 ",
                                                  "0x1p3", "1e-50", "\xd9\xa1", "1,5", "\"1\"", "NaN", "1e400",
                                                  "4.9e-324", "--1", "1e", "+", "."};
  std::vector<std::string> ls = lines(csv);
  const size_t at = ls.empty() ? 0 : r.below(ls.size());
  switch (r.below(8)) {
    case 0:
    case 1: {
      if (ls.empty()) break;
      std::vector<std::string> cells;
      std::stringstream ss(ls[at]);
      for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
      if (cells.empty()) cells.push_back("");
      const std::string cell = r.pick(kCells);
      cells[r.below(cells.size())] = cell;
      std::string row;
      for (size_t i = 0; i < cells.size(); ++i) row += (i ? "," : "") + cells[i];
      ls[at] = row;
      csv = joinLines(ls);
      return "csv line " + std::to_string(at + 1) + " cell := " + plainOrQuoted(cell);
    }
    case 2:
      if (!ls.empty()) ls[at] += r.percent(50) ? ",1" : ",";
      csv = joinLines(ls);
      return "csv line " + std::to_string(at + 1) + " gets a cell more";
    case 3: {
      const size_t keep = r.pick<size_t>({0, 1, 2});
      ls.resize(std::min(ls.size(), keep));
      csv = joinLines(ls);
      return "csv keeps " + std::to_string(keep) + " lines";
    }
    case 4:
      csv = joinLines(ls, "\r\n");
      if (r.percent(50)) csv = "\xef\xbb\xbf" + csv;
      return "csv CRLF/BOM";
    case 5:
      if (!ls.empty()) ls.insert(ls.begin() + static_cast<std::ptrdiff_t>(at), r.percent(50) ? "" : ls[0]);
      csv = joinLines(ls);
      return "csv blank or repeated header at line " + std::to_string(at + 1);
    case 6:
      if (!csv.empty()) csv.pop_back();
      if (r.percent(50)) csv += std::string(100000, '1');
      return "csv no final newline / long cell";
    default:
      if (!ls.empty()) ls[0] = r.percent(50) ? ls[0] + "," + ls[0] : std::string(ls[0].size() > 1 ? "," : "") + ls[0];
      csv = joinLines(ls);
      return "csv header changed";
  }
  return "csv unchanged";
}

// A --set flag that names a key the config has, one it has not, or no key at all.
std::string setFlag(Rng& r, YNode& root) {
  std::vector<Slot> slots;
  collect(root, "", slots);
  const int k = static_cast<int>(r.below(10));
  if (k < 6 && !slots.empty()) {
    std::string path = r.pick(slots).path;
    if (k == 5) path += "." + r.pick<std::string>({"x", "0", "99", "-1", "18446744073709551616", ""});
    std::string value = anyValue(r);
    if (value.size() > 200 || r.percent(10)) value = deep(r);
    return path + "=" + value;
  }
  static const std::vector<std::string> kOdd = {
      "=1", "noequals", "a..b=1", ".a=1", "a.=1", "model.layers.-1=1", "model.layers.99.linear.units=1",
      "model.layers.x=1", "name.sub=1", "data.kind.x=1", "nope=1", "data.nope=1", "model=", "data=[",
      "train.optimizer.lr={", "model.layers.0=[", "train.batch_size=1=2", "model.layers=[]", "data={}",
      "model.layers.0.linear.units=1e3", "train={steps: -1}", "\xc3\xa9=1", "=", "..=1", "seed=-1"};
  return r.pick(kOdd);
}

}  // namespace

std::vector<SeedConfig> loadSeedConfigs(const std::string& configDir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(configDir))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<SeedConfig> seeds;
  for (const fs::path& f : files) {
    SeedConfig s{f.filename().string(), fromYaml(YAML::LoadFile(f.string()))};
    shrink(s.tree, "");
    if (YNode* t = s.tree.find("train")) t->set("steps", I(2));
    seeds.push_back(std::move(s));
  }
  return seeds;
}

FuzzCase CaseGenerator::make(uint64_t index) const {
  Rng r{seed_ * 0x100000001b3ULL ^ (index + 1) * 0x9e3779b97f4a7c15ULL};
  r.next();
  FuzzCase c;
  c.index = index;
  std::string csv;
  YNode root;
  if (!seeds_.empty() && r.percent(25)) {
    const SeedConfig& s = r.pick(seeds_);
    root = s.tree;
    c.origin = "configs/" + s.name;
  } else {
    root = generated(r, c.origin, csv);
  }

  // Mutations: none for about one case in eight (those must train: exit 0).
  std::vector<std::string> sets;
  if (!r.percent(12)) {
    const int64_t n = r.range(1, 3);
    bool text = false;
    for (int64_t i = 0; i < n; ++i) {
      const int what = static_cast<int>(r.below(100));
      std::string done;
      if (what < 30 && root.find("model") && root.find("model")->kind == Kind::Map)
        done = root.find("model")->find("nodes") ? randomNode(r, *root.find("model")) : layerMutation(r, *root.find("model"));
      if (!done.empty()) c.mutations.push_back(done);
      else if (what < 60) c.mutations.push_back(mutateTree(r, root));
      else if (what < 70) text = true;
      else if (what < 80 && !csv.empty()) c.mutations.push_back(mutateCsv(r, csv));
      else {
        sets.push_back(setFlag(r, root));
        c.mutations.push_back("--set " + sets.back());
      }
    }
    c.yaml = emitYaml(root);
    if (text) c.mutations.push_back(mutateText(r, c.yaml));
  } else {
    c.yaml = emitYaml(root);
    if (r.percent(30)) sets.push_back(r.pick<std::string>({"train.optimizer.lr=0.01", "seed=1", "train.batch_size=2",
                                                            "compiler.fuse=false", "name=renamed"}));
  }
  if (!csv.empty()) c.files.emplace_back("data.csv", csv);

  c.args = {"--config", std::string(kDirToken) + "/config.yaml", "--device", "cpu", "--steps",
            std::to_string(r.percent(3) ? 0 : r.range(1, 3)), "--progress", "lines"};
  for (const std::string& s : sets) {
    c.args.push_back("--set");
    c.args.push_back(s);
  }
  const int flag = static_cast<int>(r.below(100));
  if (flag < 15) c.args.push_back("--no-fuse");
  else if (flag < 20) c.args.push_back("--compare");
  else if (flag < 26) c.args.insert(c.args.end(), {"--metrics", std::string(kDirToken) + (r.percent(50) ? "/m.csv" : "/m.jsonl")});
  else if (flag < 29) c.args.insert(c.args.end(), {"--dump-graph", std::string(kDirToken) + "/graphs"});
  else if (flag < 32) c.args.push_back("--verbose");
  return c;
}

}  // namespace pa::fuzz
