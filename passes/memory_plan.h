// Liveness-based memory planning: every activation gets an offset in one arena, and values
// whose lifetimes do not overlap share bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace pa {

struct MemoryPlan {
  std::vector<int64_t> offset;  // per ValueId, in elements (or 4-byte units); -1 for values not in the arena
  std::vector<ValueId> root;    // per ValueId: the value whose bytes it uses (itself unless an aliased reshape)
  int64_t arenaElements = 0;    // the arena's size: the peak of simultaneously live activations
  int64_t naiveElements = 0;    // what one buffer per value would need
  int64_t placementSteps = 0;   // work done placing values (comparisons, free-list operations), for tests
};

// Graphs with up to this many values to place are planned greedy by size (tight, quadratic
// time); larger ones in execution order with a best-fit free list (O(n log n)): a model of
// thousands of layers would otherwise spend most of its start-up here.
constexpr size_t kGreedyBySizeLimit = 4096;

// Inputs, constants and graph outputs live for the whole run (inputs are written before it,
// outputs read after it); parameters are bound from outside and get no offset. Every other
// value lives from its producer to its last user. Placement is greedy by size (largest first),
// each value at the lowest offset that overlaps no placed value with an overlapping lifetime;
// above kGreedyBySizeLimit values, in execution order into best-fitting free blocks.
// With `aliasReshapes`, a Reshape's output shares its input's bytes (tensors are contiguous,
// so a reshape changes no byte): the two are planned as one value living from the first's
// producer to the last user of either, and the executor need not copy (the GPU runner skips
// those kernels); a reshape that changes the dtype is a copy. A reshape of a parameter (or of
// such a reshape) shares the parameter's bytes, outside the arena: it gets no offset, and the
// executor binds it to the parameter's address. With `storageSizes`, sizes and
// offsets count 4-byte units and each value takes its dtype's bytes (a bf16 value half as many
// units as elements: the GPU's arena); without, one unit per element whatever the dtype (the
// CPU executor keeps every value in its own float or double).
// Sizes add up without overflow: should the values together exceed 2^62 units (no machine
// holds that), the plan gives up: arenaElements and naiveElements are INT64_MAX and no value
// has an offset. checkFitsMemory rejects such a graph before anything runs it. `liveToEnd`: values
// read after the run as outputs are (a packed gradient that Adam reads in place of its slices).
// `inputsUntil` (indexed by NodeId, empty for none): a node that may still run after the nodes
// behind it in the execution order (the GPU runner's second stream) reads its inputs until that
// position of g.topoOrder() (inclusive; its own position or less: as any node). Its outputs are
// born at its own position, where it may start.
MemoryPlan planMemory(const Graph& g, int64_t alignElements = 16, bool aliasReshapes = false, bool storageSizes = false,
                      const std::vector<ValueId>& liveToEnd = {}, const std::vector<int64_t>& inputsUntil = {});
// The backward's branches off its chain: nodes whose results reach nothing but parameters'
// gradients (graph outputs named gradOutputName(param)) through nodes that merely move or sum
// values (casts, slices, (de)interleaves, adds, reductions). So a weight-gradient product is one
// (with the slices and sums after it) and the product of the chain's next input gradient is not,
// even where it only leads to gradients. Nothing else in the step waits for them, so the GPU
// runner queues them on a second stream beside the chain. Never an attention node (its launcher
// keeps per-launcher state that assumes one stream). Indexed by NodeId: 1 for such a node.
std::vector<char> gradientLeafNodes(const Graph& g);
// Whether node `id` is a Reshape whose output shares its input's bytes in `plan` (planned with
// aliasReshapes): the GPU runner launches nothing for it, and --dump-kernels writes nothing.
bool aliasedReshape(const Graph& g, NodeId id, const MemoryPlan& plan);

// How a backend stores a training step, for memoryNeed.
struct MemoryLayout {
  int64_t elementBytes = 4;    // bytes per element of every value (the CPU's float or double)
  bool storageSizes = false;   // instead: each value's own dtype, in 4-byte units (the GPU arena)
  bool aliasReshapes = false;  // as planMemory's flag
  int64_t alignElements = 16;
  int paramCopies = 3;         // copies of each parameter the backend keeps: weights, Adam's m and v
  int64_t paramBytes = 4;      // bytes per parameter element (fp32 master weights on the GPU)
};

// The bytes a training step over `g` needs: its activation arena as planMemory places it, plus
// every parameter `paramCopies` times; saturates at INT64_MAX. Names the largest parameter and
// the largest activation, for messages.
struct MemoryNeed {
  int64_t activationBytes = 0, parameterBytes = 0, totalBytes = 0;
  ValueId largestParam = kNoValue, largestActivation = kNoValue;
  int64_t largestParamBytes = 0, largestActivationBytes = 0;
};
// `plan`: the graph's plan under `layout` when the caller has it (else planned here).
MemoryNeed memoryNeed(const Graph& g, const MemoryLayout& layout, const MemoryPlan* plan = nullptr);

// Throws UserError (exit code 2) when the step needs more than `availableBytes` of `device`
// ("this machine", "GPU 0 (NVIDIA H100 80GB HBM3)"), naming what takes the most: the largest
// parameter with its origin in the config ("cfg.yaml:5:7: model.layers.0.linear.units =
// 1000000000000 needs 3.6 TiB of weights ...") or the largest activation. Call it before
// allocating anything for the graph: every backend, with its own device's memory.
void checkFitsMemory(const Graph& g, int64_t availableBytes, const std::string& device, const MemoryLayout& layout,
                     const MemoryPlan* plan = nullptr);

// "512 B", "24.0 GiB", "3.6 TiB": binary units, for messages.
std::string byteString(int64_t bytes);

}  // namespace pa
