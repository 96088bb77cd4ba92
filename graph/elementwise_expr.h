// The expression a FusedElementwise node evaluates: a small tree of elementwise ops over the
// node's inputs, written as text in its `expr` attribute ("relu(add($0, $1))").
#pragma once

#include <string>
#include <vector>

#include "graph/op.h"

namespace pa {

struct ExprNode {
  OpKind op = OpKind::Input;  // Input: a leaf reading node input `input`
  int input = -1;
  double value = 0.0;         // Scale's factor
  std::vector<int> args;      // indices of earlier ExprNodes
};

// Nodes in post-order: arguments come before their users; the last node is the result.
struct Expr {
  std::vector<ExprNode> nodes;
};

// Whether an op may appear inside an expression (elementwise or broadcast, one output, and a
// value that depends only on the same element of its inputs).
bool isExprOp(OpKind op);
std::string exprToString(const Expr& e);
// Parses exprToString's output; throws std::invalid_argument naming the position on bad text.
Expr parseExpr(const std::string& text);

}  // namespace pa
