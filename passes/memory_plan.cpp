// Memory planning by lifetimes and greedy-by-size placement.
#include "passes/memory_plan.h"

#include <algorithm>
#include <limits>

namespace pa {

MemoryPlan planMemory(const Graph& g, int64_t align, bool aliasReshapes, bool storageSizes) {
  const std::vector<NodeId> order = g.topoOrder();
  const int64_t end = static_cast<int64_t>(order.size());
  const size_t nv = g.numValues();
  std::vector<int64_t> first(nv, std::numeric_limits<int64_t>::max()), last(nv, -1);
  std::vector<char> planned(nv, 0);
  // root[v]: the value whose bytes v uses (itself unless it is an aliased reshape). Lifetimes
  // are kept per root, so a root lives as long as any of its aliases.
  std::vector<ValueId> root(nv);
  for (size_t v = 0; v < nv; ++v) root[v] = static_cast<ValueId>(v);
  for (int64_t pos = 0; pos < end; ++pos) {
    const Node& n = g.node(order[static_cast<size_t>(pos)]);
    for (ValueId v : n.inputs) last[root[v]] = std::max(last[root[v]], pos);
    for (ValueId v : n.outputs) {
      if (n.op == OpKind::Param) continue;
      if (aliasReshapes && n.op == OpKind::Reshape && planned[root[n.inputs[0]]] &&
          g.value(n.inputs[0]).type.dtype == g.value(v).type.dtype) {
        root[v] = root[n.inputs[0]];
        last[root[v]] = std::max(last[root[v]], pos);
        continue;
      }
      planned[v] = 1;
      const bool pinned = n.op == OpKind::Input || n.op == OpKind::Constant;
      first[v] = pinned ? -1 : pos;
      last[v] = std::max(last[v], pinned ? end : pos);
    }
  }
  for (const auto& kv : g.outputs()) last[root[kv.second]] = end;

  struct Item {
    ValueId v;
    int64_t size;
  };
  std::vector<Item> items;
  MemoryPlan plan;
  plan.offset.assign(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    if (!planned[v]) continue;
    int64_t n = numel(g.shape(static_cast<ValueId>(v)));
    if (storageSizes) n = (n * static_cast<int64_t>(dtypeSize(g.value(static_cast<ValueId>(v)).type.dtype)) + 3) / 4;
    items.push_back({static_cast<ValueId>(v), (n + align - 1) / align * align});
    plan.naiveElements += n;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.size > b.size; });
  std::vector<Item> placed;
  for (const Item& it : items) {
    // Intervals already taken by values alive at the same time, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Item& p : placed)
      if (!(last[p.v] < first[it.v] || last[it.v] < first[p.v])) busy.emplace_back(plan.offset[p.v], plan.offset[p.v] + p.size);
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& b : busy) {
      if (at + it.size <= b.first) break;
      at = std::max(at, b.second);
    }
    plan.offset[it.v] = at;
    plan.arenaElements = std::max(plan.arenaElements, at + it.size);
    placed.push_back(it);
  }
  for (size_t v = 0; v < nv; ++v)
    if (root[v] != static_cast<ValueId>(v)) plan.offset[v] = plan.offset[root[v]];
  return plan;
}

}  // namespace pa
