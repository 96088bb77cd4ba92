// Liveness-based memory planning: every activation gets an offset in one arena, and values
// whose lifetimes do not overlap share bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace pa {

struct MemoryPlan {
  std::vector<int64_t> offset;  // per ValueId, in elements (or 4-byte units); -1 for values not in the arena
  int64_t arenaElements = 0;    // the arena's size: the peak of simultaneously live activations
  int64_t naiveElements = 0;    // what one buffer per value would need
};

// Inputs, constants and graph outputs live for the whole run (inputs are written before it,
// outputs read after it); parameters are bound from outside and get no offset. Every other
// value lives from its producer to its last user. Placement is greedy by size (largest first),
// each value at the lowest offset that overlaps no placed value with an overlapping lifetime.
// With `aliasReshapes`, a Reshape's output shares its input's bytes (tensors are contiguous,
// so a reshape changes no byte): the two are planned as one value living from the first's
// producer to the last user of either, and the executor need not copy (the GPU runner skips
// those kernels); a reshape that changes the dtype is a copy. With `storageSizes`, sizes and
// offsets count 4-byte units and each value takes its dtype's bytes (a bf16 value half as many
// units as elements: the GPU's arena); without, one unit per element whatever the dtype (the
// CPU executor keeps every value in its own float or double).
MemoryPlan planMemory(const Graph& g, int64_t alignElements = 16, bool aliasReshapes = false, bool storageSizes = false);

}  // namespace pa
