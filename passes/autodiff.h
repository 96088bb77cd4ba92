// Reverse-mode autodiff: appends the backward graph of a scalar loss to the graph.
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"

namespace pa {

// Adds nodes computing d loss / d v for every value in `wrt` and records each as graph output
// "grad/<value name>". Returns value -> gradient value. A value the loss does not depend on gets
// a zero constant. Throws std::logic_error when a needed rule is missing (a BackwardOnly op on
// the path).
std::map<ValueId, ValueId> appendBackward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt);

// Name of the graph output holding the gradient of parameter `param`.
std::string gradOutputName(const std::string& param);

}  // namespace pa
