// Memory planning by lifetimes and greedy-by-size placement.
#include "passes/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "common/errors.h"
#include "passes/autodiff.h"

namespace pa {

namespace {

struct Item {
  ValueId v;
  int64_t size;
};

// Greedy by size (largest first), each value at the lowest offset clear of every placed value
// live at the same time: tight plans, but each placement scans the values placed before it, so
// the work is quadratic in the number of values.
void placeGreedyBySize(std::vector<Item>& items, const std::vector<int64_t>& first, const std::vector<int64_t>& last,
                       MemoryPlan& plan) {
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.size > b.size; });
  std::vector<Item> placed;
  for (const Item& it : items) {
    // Intervals already taken by values alive at the same time, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Item& p : placed) {
      ++plan.placementSteps;
      if (!(last[p.v] < first[it.v] || last[it.v] < first[p.v])) busy.emplace_back(plan.offset[p.v], plan.offset[p.v] + p.size);
    }
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
}

// In execution order, as an allocator would: at each position the values born there take the
// best-fitting free block (the smallest that holds them, lowest offset among equals; else the
// top of the arena, grown), then the values whose last use is there give their blocks back,
// merged with free neighbours. O(n log n) in the number of values.
void placeInOrder(const std::vector<Item>& items, const std::vector<int64_t>& first, const std::vector<int64_t>& last,
                  int64_t end, MemoryPlan& plan) {
  // Positions run from -1 (inputs and constants, live before the first node) to `end`.
  std::vector<std::vector<size_t>> born(static_cast<size_t>(end + 2)), dies(static_cast<size_t>(end + 2));
  for (size_t i = 0; i < items.size(); ++i) {
    born[static_cast<size_t>(first[items[i].v] + 1)].push_back(i);
    dies[static_cast<size_t>(last[items[i].v] + 1)].push_back(i);
  }
  std::map<int64_t, int64_t> freeByOffset;          // offset -> size
  std::set<std::pair<int64_t, int64_t>> freeBySize;  // (size, offset)
  int64_t top = 0;
  auto take = [&](int64_t at) {
    const int64_t size = freeByOffset.at(at);
    freeByOffset.erase(at);
    freeBySize.erase({size, at});
  };
  auto give = [&](int64_t at, int64_t size) {
    auto next = freeByOffset.find(at + size);
    if (next != freeByOffset.end()) {
      const int64_t nextSize = next->second;
      take(next->first);
      size += nextSize;
    }
    auto prev = freeByOffset.lower_bound(at);
    if (prev != freeByOffset.begin() && (--prev, prev->first + prev->second == at)) {
      const int64_t prevAt = prev->first;
      size += prev->second;
      take(prevAt);
      at = prevAt;
    }
    if (at + size == top) {  // the top of the arena: shrink it instead
      top = at;
      return;
    }
    freeByOffset[at] = size;
    freeBySize.insert({size, at});
  };
  for (size_t pos = 0; pos < born.size(); ++pos) {
    for (size_t i : born[pos]) {
      const Item& it = items[i];
      ++plan.placementSteps;
      auto fit = freeBySize.lower_bound({it.size, std::numeric_limits<int64_t>::min()});
      int64_t at;
      if (fit != freeBySize.end()) {
        at = fit->second;
        const int64_t size = fit->first;
        take(at);
        if (size > it.size) {
          freeByOffset[at + it.size] = size - it.size;
          freeBySize.insert({size - it.size, at + it.size});
        }
      } else {
        at = top;
        top += it.size;
      }
      plan.offset[it.v] = at;
      plan.arenaElements = std::max(plan.arenaElements, top);
    }
    for (size_t i : dies[pos]) {
      ++plan.placementSteps;
      give(plan.offset[items[i].v], items[i].size);
    }
  }
}

}  // namespace

MemoryPlan planMemory(const Graph& g, int64_t align, bool aliasReshapes, bool storageSizes,
                      const std::vector<ValueId>& liveToEnd, const std::vector<int64_t>& inputsUntil) {
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
    const NodeId id = order[static_cast<size_t>(pos)];
    const Node& n = g.node(id);
    const int64_t readUntil = inputsUntil.empty() ? pos : std::max(pos, inputsUntil[static_cast<size_t>(id)]);
    for (ValueId v : n.inputs) last[root[v]] = std::max(last[root[v]], readUntil);
    for (ValueId v : n.outputs) {
      if (n.op == OpKind::Param) continue;
      const bool aliasable = aliasReshapes && n.op == OpKind::Reshape &&
                             (planned[root[n.inputs[0]]] || g.producer(root[n.inputs[0]]).op == OpKind::Param);
      if (aliasable && g.value(n.inputs[0]).type.dtype == g.value(v).type.dtype) {
        root[v] = root[n.inputs[0]];
        last[root[v]] = std::max(last[root[v]], readUntil);
        continue;
      }
      planned[v] = 1;
      const bool pinned = n.op == OpKind::Input || n.op == OpKind::Constant;
      first[v] = pinned ? -1 : pos;
      last[v] = std::max(last[v], pinned ? end : pos);
    }
  }
  for (const auto& kv : g.outputs()) last[root[kv.second]] = end;
  for (ValueId v : liveToEnd) last[root[v]] = end;

  std::vector<Item> items;
  MemoryPlan plan;
  plan.offset.assign(nv, -1);
  plan.root = root;
  // Each value holds at most kMaxElements (Graph::add), so one size cannot overflow; their sum
  // bounds every offset and the arena, so once it is known to fit, nothing below can overflow.
  constexpr int64_t kMaxTotal = int64_t{1} << 62;
  int64_t total = 0;
  for (size_t v = 0; v < nv; ++v) {
    if (!planned[v]) continue;
    int64_t n = numel(g.shape(static_cast<ValueId>(v)));
    if (storageSizes) n = (n * static_cast<int64_t>(dtypeSize(g.value(static_cast<ValueId>(v)).type.dtype)) + 3) / 4;
    const int64_t size = (n + align - 1) / align * align;
    items.push_back({static_cast<ValueId>(v), size});
    total += size;
    plan.naiveElements += n;
    if (total > kMaxTotal) {
      plan.arenaElements = plan.naiveElements = std::numeric_limits<int64_t>::max();
      plan.offset.assign(nv, -1);
      return plan;
    }
  }
  if (items.size() <= kGreedyBySizeLimit) placeGreedyBySize(items, first, last, plan);
  else placeInOrder(items, first, last, end, plan);
  for (size_t v = 0; v < nv; ++v)
    if (root[v] != static_cast<ValueId>(v)) plan.offset[v] = plan.offset[root[v]];
  return plan;
}

namespace {

// What moves or sums values (elementwise, broadcast, injective and reduction ops, casts, slices,
// (de)interleaves): the only ops the second stream's nodes may have downstream. Everything else
// (products, attention, norms) is the backward's chain itself.
bool movesValues(OpKind op) {
  if (op == OpKind::Cast || op == OpKind::Slice || op == OpKind::Deinterleave || op == OpKind::Interleave) return true;
  return opInfo(op).fusion != FusionKind::Opaque;
}

bool isAttention(OpKind op) {
  return op == OpKind::FlashAttention || op == OpKind::FlashAttentionGrad || op == OpKind::FlashAttentionQkv ||
         op == OpKind::FlashAttentionQkvGrad;
}

}  // namespace

std::vector<char> gradientLeafNodes(const Graph& g) {
  std::vector<char> gradient(g.numValues(), 0), other(g.numValues(), 0);  // graph outputs by kind
  for (ValueId p : g.params())
    if (auto it = g.outputs().find(gradOutputName(g.value(p).name)); it != g.outputs().end()) gradient[it->second] = 1;
  for (const auto& kv : g.outputs())
    if (!gradient[kv.second]) other[kv.second] = 1;
  const std::vector<std::vector<NodeId>> users = g.users();
  // only: every output reaches nothing but parameters' gradients; light: so does everything
  // downstream, and all of it merely moves or sums values.
  std::vector<char> only(g.numNodes(), 0), light(g.numNodes(), 0), leaf(g.numNodes(), 0);
  const std::vector<NodeId> order = g.topoOrder();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t i = static_cast<size_t>(*it);
    const Node& n = g.node(*it);
    if (n.op == OpKind::Input || n.op == OpKind::Param || n.op == OpKind::Constant) continue;
    bool ok = !n.outputs.empty(), below = true;
    for (ValueId v : n.outputs) {
      const std::vector<NodeId>& us = users[static_cast<size_t>(v)];
      ok = ok && !other[v] && (gradient[v] || !us.empty());
      for (NodeId u : us) {
        ok = ok && only[static_cast<size_t>(u)];
        below = below && light[static_cast<size_t>(u)];
      }
    }
    only[i] = ok;
    light[i] = ok && below && movesValues(n.op);
    leaf[i] = ok && below && !isAttention(n.op);
  }
  return leaf;
}

bool aliasedReshape(const Graph& g, NodeId id, const MemoryPlan& plan) {
  const Node& n = g.node(id);
  return n.op == OpKind::Reshape && plan.root[static_cast<size_t>(n.outputs[0])] != n.outputs[0];
}

namespace {

int64_t saturatingMul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}
int64_t saturatingAdd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// Where the user wrote what made `v`: its producer's origin, else the nearest one upstream
// (autodiff's nodes have none; their inputs lead back to the layer, and the graph's input is
// located at train.batch_size). "" when no node on the way has one (a graph built in code).
std::string nearestOrigin(const Graph& g, ValueId v) {
  std::vector<char> seen(g.numNodes(), 0);
  std::deque<NodeId> queue{g.value(v).producer};
  while (!queue.empty()) {
    const Node& n = g.node(queue.front());
    queue.pop_front();
    if (!n.origin.empty()) return n.origin;
    for (ValueId in : n.inputs) {
      const NodeId p = g.value(in).producer;
      if (!seen[static_cast<size_t>(p)]) {
        seen[static_cast<size_t>(p)] = 1;
        queue.push_back(p);
      }
    }
  }
  return "";
}

}  // namespace

std::string byteString(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

MemoryNeed memoryNeed(const Graph& g, const MemoryLayout& layout, const MemoryPlan* given) {
  MemoryNeed need;
  const MemoryPlan plan = given ? *given : planMemory(g, layout.alignElements, layout.aliasReshapes, layout.storageSizes);
  const int64_t unit = layout.storageSizes ? 4 : layout.elementBytes;
  need.activationBytes = saturatingMul(plan.arenaElements, unit);
  // The largest activation: every live value but the parameters (whether or not planMemory
  // placed it: it gives up on graphs too large to place).
  for (const Node& n : g.nodes()) {
    if (n.erased || n.op == OpKind::Param) continue;
    for (ValueId v : n.outputs) {
      const int64_t elementBytes = layout.storageSizes ? static_cast<int64_t>(dtypeSize(g.value(v).type.dtype)) : unit;
      const int64_t bytes = numel(g.shape(v)) * elementBytes;  // <= 2^51: exact
      if (bytes > need.largestActivationBytes) {
        need.largestActivationBytes = bytes;
        need.largestActivation = v;
      }
    }
  }
  for (ValueId p : g.params()) {
    const int64_t bytes = numel(g.shape(p)) * layout.paramBytes;  // <= 2^51: exact
    need.parameterBytes = saturatingAdd(need.parameterBytes, saturatingMul(bytes, layout.paramCopies));
    if (bytes > need.largestParamBytes) {
      need.largestParamBytes = bytes;
      need.largestParam = p;
    }
  }
  need.totalBytes = saturatingAdd(need.activationBytes, need.parameterBytes);
  return need;
}

void checkFitsMemory(const Graph& g, int64_t availableBytes, const std::string& device, const MemoryLayout& layout,
                     const MemoryPlan* plan) {
  const MemoryNeed need = memoryNeed(g, layout, plan);
  if (need.totalBytes <= availableBytes) return;
  const std::string total = need.totalBytes == std::numeric_limits<int64_t>::max() ? "more than 8 EiB"
                                                                                  : byteString(need.totalBytes);
  const std::string tail = "; the training step needs " + total + " in all (" + byteString(need.parameterBytes) +
                           " for parameters and their optimizer state, " +
                           (need.activationBytes == std::numeric_limits<int64_t>::max()
                                ? std::string("more than 8 EiB")
                                : byteString(need.activationBytes)) +
                           " for activations) and " + device + " has " + byteString(availableBytes);
  if (need.largestParam != kNoValue && need.parameterBytes >= need.activationBytes) {
    const Node& p = g.producer(need.largestParam);
    const std::string what = "parameter '" + p.name + "' " + shapeString(g.shape(need.largestParam));
    throw UserError((p.origin.empty() ? what : p.origin) + " needs " + byteString(need.largestParamBytes) +
                    " of weights (" + what + ")" + tail);
  }
  std::string largest, origin;
  if (need.largestActivation != kNoValue) {
    largest = " (the largest, '" + g.value(need.largestActivation).name + "' " +
              shapeString(g.shape(need.largestActivation)) + ", takes " + byteString(need.largestActivationBytes) +
              "; train.batch_size and the model's widths set these sizes)";
    origin = nearestOrigin(g, need.largestActivation);
  }
  throw UserError((origin.empty() ? "" : origin + ": ") + "the model's activations do not fit" + largest + tail);
}

}  // namespace pa
