// Typed errors for people: user mistakes carry a location; main turns them into exit code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace pa {

// Base of every error caused by the user's input (config, data file, shapes of a model).
class UserError : public std::runtime_error {
public:
  explicit UserError(const std::string& what) : std::runtime_error(what) {}
};

// A shape or dtype mismatch found while building or verifying a graph; names the node.
class ShapeError : public UserError {
public:
  ShapeError(const std::string& node, const std::string& message)
      : UserError("node '" + node + "': " + message), node_(node) {}
  const std::string& node() const { return node_; }

private:
  std::string node_;
};

// What `train` and `predict` print for std::bad_alloc (exit 1): host memory ran out, which the
// size checks before allocating (data.samples, layer widths) cannot rule out on a smaller machine
// or under a memory limit.
inline constexpr const char* kOutOfHostMemory =
    "out of host memory (std::bad_alloc): the data (data.samples x the values a sample holds), the parameters "
    "or a step's activations need more than this process may allocate; lower data.samples, the layer widths or "
    "train.batch_size, or raise the memory limit";

}  // namespace pa
