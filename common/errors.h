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

}  // namespace pa
