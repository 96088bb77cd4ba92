// Model FLOPs of a training graph (codegen/flops.h).
#include "codegen/flops.h"

#include <algorithm>
#include <vector>

#include "codegen/emit.h"
#include "common/attention_mask.h"
#include "graph/node_attrs.h"
#include "passes/memory_plan.h"

namespace pa::codegen {

namespace {

// Query-key pairs the mask leaves visible, over one head of one batch entry.
double visiblePairs(const FlashAttentionConfig& f) {
  double pairs = 0;
  for (long long q = 0; q < f.qLen; ++q) {
    long long lo = 0, hi = 0;
    attentionBand(f.mask, q, f.qLen, f.kLen, &lo, &hi);
    const long long band = std::max(0LL, hi - lo + 1);
    const long long sinkLimit = attentionSinkLimit(f.mask, q, f.qLen, f.kLen);  // keys 0..sinkLimit, -1: none
    const long long sinksInBand = std::max(0LL, std::min(sinkLimit, hi) - lo + 1);
    pairs += static_cast<double>(band + std::max(0LL, sinkLimit + 1) - sinksInBand);
  }
  return pairs;
}

}  // namespace

double nodeFlops(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op == OpKind::FlashAttention || n.op == OpKind::FlashAttentionQkv || n.op == OpKind::FlashAttentionGrad ||
      n.op == OpKind::FlashAttentionQkvGrad) {
    const FlashAttentionConfig f = flashConfigOf(g, n);
    const double forward = 4.0 * f.batch * f.heads * f.headDim * visiblePairs(f);
    return n.op == OpKind::FlashAttention || n.op == OpKind::FlashAttentionQkv ? forward : 2.5 * forward;
  }
  const LibraryGemm lg = libraryGemmOf(g, id);
  if (!lg.supported) return 0;
  const GemmGeometry& q = lg.geometry;
  return 2.0 * static_cast<double>(q.batch) * static_cast<double>(q.m) * static_cast<double>(q.n) * static_cast<double>(q.k);
}

std::vector<char> secondStreamNodes(const Graph& g, double maxFlops) {
  std::vector<char> side = gradientLeafNodes(g);
  // A leaf product's consumers are never products (gradientLeafNodes): they may stay.
  const std::vector<NodeId> order = g.topoOrder();
  double chainAfter = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t i = static_cast<size_t>(*it);
    const double work = nodeFlops(g, *it);
    if (side[i] && work > 0 && (work * kSecondStreamChainRatio > chainAfter || (maxFlops > 0 && work > maxFlops))) side[i] = 0;
    if (!side[i]) chainAfter += work;
  }
  return side;
}

double modelFlops(const Graph& g) {
  // The forward pass: what the loss depends on.
  std::vector<char> forward(g.numNodes(), 1);
  if (g.outputs().count("loss")) {
    const ValueId loss = g.output("loss");
    std::fill(forward.begin(), forward.end(), 0);
    std::vector<ValueId> todo{loss};
    while (!todo.empty()) {
      const NodeId id = g.value(todo.back()).producer;
      todo.pop_back();
      if (forward[static_cast<size_t>(id)]) continue;
      forward[static_cast<size_t>(id)] = 1;
      for (ValueId v : g.node(id).inputs) todo.push_back(v);
    }
  }
  double total = 0;
  for (NodeId id : g.topoOrder()) {
    if (!forward[static_cast<size_t>(id)]) continue;
    const Node& n = g.node(id);
    if (n.op == OpKind::MatMul || n.op == OpKind::FusedLinear) {
      total += 3 * nodeFlops(g, id);
    } else if (n.op == OpKind::FusedMlp || n.op == OpKind::FusedMlpTrain) {
      const MlpSpec s = mlpSpecOf(g, n);
      for (const MlpLayer& l : s.layers)
        total += 3 * 2.0 * static_cast<double>(s.rows) * static_cast<double>(l.in) * static_cast<double>(l.out);
    } else if (n.op == OpKind::FlashAttention || n.op == OpKind::FlashAttentionQkv) {
      total += 3.5 * nodeFlops(g, id);
    }
  }
  return total;
}

}  // namespace pa::codegen
