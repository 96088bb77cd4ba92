// Printing and parsing of FusedElementwise expressions. Scale's factor is printed with 17
// significant digits so that a round trip is exact.
#include "graph/elementwise_expr.h"

#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace pa {

bool isExprOp(OpKind op) {
  switch (op) {
  case OpKind::Add: case OpKind::Sub: case OpKind::Mul: case OpKind::Div: case OpKind::Scale:
  case OpKind::Relu: case OpKind::Gelu: case OpKind::Tanh: case OpKind::Sigmoid: case OpKind::Exp:
  case OpKind::BroadcastTo: case OpKind::ReluGrad: case OpKind::GeluGrad: case OpKind::TanhGrad:
  case OpKind::SigmoidGrad: case OpKind::Silu: case OpKind::GeluTanh: case OpKind::SiluGrad: case OpKind::GeluTanhGrad:
    return true;
  default:
    return false;
  }
}

namespace {

void print(const Expr& e, int i, std::string& out) {
  const ExprNode& n = e.nodes[static_cast<size_t>(i)];
  if (n.op == OpKind::Input) {
    out += "$" + std::to_string(n.input);
    return;
  }
  out += opName(n.op);
  if (n.op == OpKind::Scale) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "[%.17g]", n.value);
    out += buf;
  }
  out += "(";
  for (size_t a = 0; a < n.args.size(); ++a) {
    if (a) out += ", ";
    print(e, n.args[a], out);
  }
  out += ")";
}

struct Parser {
  const std::string& s;
  size_t pos = 0;
  Expr e;

  [[noreturn]] void fail(const std::string& what) {
    throw std::invalid_argument("bad elementwise expression at " + std::to_string(pos) + ": " + what + " in '" + s + "'");
  }
  void skip() {
    while (pos < s.size() && s[pos] == ' ') ++pos;
  }
  void expect(char c) {
    skip();
    if (pos >= s.size() || s[pos] != c) fail(std::string("expected '") + c + "'");
    ++pos;
  }
  int node() {
    skip();
    if (pos < s.size() && s[pos] == '$') {
      ++pos;
      const size_t start = pos;
      while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
      if (start == pos) fail("expected an input number");
      ExprNode n;
      n.input = std::atoi(s.substr(start, pos - start).c_str());
      e.nodes.push_back(n);
      return static_cast<int>(e.nodes.size()) - 1;
    }
    const size_t start = pos;
    while (pos < s.size() && (std::isalnum(static_cast<unsigned char>(s[pos])) || s[pos] == '-')) ++pos;
    OpKind op;
    if (!opFromName(s.substr(start, pos - start), op) || !isExprOp(op)) fail("unknown op");
    ExprNode n;
    n.op = op;
    if (op == OpKind::Scale) {
      expect('[');
      char* endp = nullptr;
      n.value = std::strtod(s.c_str() + pos, &endp);
      pos = static_cast<size_t>(endp - s.c_str());
      expect(']');
    }
    expect('(');
    for (;;) {
      n.args.push_back(node());
      skip();
      if (pos < s.size() && s[pos] == ',') {
        ++pos;
        continue;
      }
      break;
    }
    expect(')');
    const size_t arity = static_cast<size_t>(opInfo(op).minInputs);  // expression ops have one arity
    if (n.args.size() != arity) fail(std::string(opName(op)) + " takes " + std::to_string(arity) + " arguments");
    e.nodes.push_back(n);
    return static_cast<int>(e.nodes.size()) - 1;
  }
};

}  // namespace

std::string exprToString(const Expr& e) {
  std::string out;
  if (!e.nodes.empty()) print(e, static_cast<int>(e.nodes.size()) - 1, out);
  return out;
}

Expr parseExpr(const std::string& text) {
  Parser p{text, 0, {}};
  p.node();
  p.skip();
  if (p.pos != text.size()) p.fail("trailing text");
  return std::move(p.e);
}

}  // namespace pa
