// Structural checks of a graph: ordering, dangling inputs, types; errors name the node.
#pragma once

#include "graph/graph.h"

namespace pa {

// Throws ShapeError describing the first problem found.
void verifyGraph(const Graph& g);

}  // namespace pa
