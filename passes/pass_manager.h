// Passes are named functions over the graph, registered once and run as a pipeline of names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace pa {

struct PassStats {
  std::string pass;
  size_t nodesBefore = 0, nodesAfter = 0;
  std::map<std::string, int64_t> counters;  // e.g. "patterns matched"
  std::vector<std::string> notes;           // e.g. why a subgraph was left unfused (--verbose)
};

// What the passes know of the targets the graph may be placed on (the CPU and, where a GPU is
// found, the CUDA device: one graph serves both, so a fused node must run on both).
struct PassTarget {
  // Attention and the layers' products read 16-bit operands (precision bf16), else fp32 (FFMA,
  // TF32 or the FP64 tensor cores).
  bool operands16Bit = false;
};

struct PassInfo {
  std::string name;         // kebab-case, as written in configs and on the command line
  std::string description;  // one line, for --help and errors
  std::vector<std::string> requires;     // passes that must appear earlier in the pipeline
  std::vector<std::string> mustPrecede;  // passes that, when present, must come later
  std::function<void(Graph&, PassStats&, const PassTarget&)> run;
};

class PassRegistry {
public:
  // The registry with every built-in pass.
  static PassRegistry& builtin();
  // Throws std::logic_error on a duplicate name.
  void add(PassInfo info);
  const PassInfo* find(const std::string& name) const;
  std::vector<std::string> names() const;

private:
  std::map<std::string, PassInfo> passes_;
};

struct PipelineOptions {
  bool verifyEach = true;   // run the verifier after every pass
  std::string dumpDir;      // when set, write NN-<pass>.txt/.dot after every pass
  std::string title = "model";
  int firstDumpIndex = 0;   // number of the first dump file
  PassTarget target;
};

// The passes a config may list for the forward graph (compiler.passes): every pass but those the
// trainer runs itself after it (autodiff, the passes that need autodiff before them, lower-bf16).
std::vector<std::string> forwardPassNames();
// Checks the names and their ordering constraints; throws UserError listing valid names.
void validatePipeline(const std::vector<std::string>& names);
// Runs the passes in order; returns one PassStats per pass.
std::vector<PassStats> runPipeline(Graph& g, const std::vector<std::string>& names, const PipelineOptions& opt);
// Writes the graph as text and DOT (and SVG when Graphviz's `dot` is on PATH) under dir.
void dumpGraph(const Graph& g, const std::string& dir, const std::string& stem, const std::string& title);

}  // namespace pa
