// Readable text and Graphviz DOT forms of a graph.
#pragma once

#include <string>

#include "graph/graph.h"

namespace pa {

std::string graphToText(const Graph& g, const std::string& title);
std::string graphToDot(const Graph& g, const std::string& title);

}  // namespace pa
