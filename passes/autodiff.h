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

// The node that only unpacks parameter `param`'s gradient from a packed one, or -1: the graph
// output gradOutputName(param) made by a Slice or Deinterleave of an fp32 value (the gradient of
// fuse-qkv's Concat or SwiGLU's Interleave of weights), read by no node. The GPU session's Adam
// reads such a gradient at its place in the packed one (CudaRunnerOptions::packedGradViews), so
// the node launches nothing there. `users`: g.users().
NodeId unpackingOfParamGradient(const Graph& g, ValueId param, const std::vector<std::vector<NodeId>>& users);

}  // namespace pa
