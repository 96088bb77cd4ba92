// Dead-code elimination.
#pragma once

#include <cstdint>

#include "graph/graph.h"

namespace pa {

// Erases nodes that no graph output depends on; inputs and parameters always stay (they are
// bound from outside). Returns the number of nodes erased.
int64_t eliminateDeadCode(Graph& g);

}  // namespace pa
