// The message of the user mistake a config makes, if any: parsed (with --set overrides), built
// and trained for one step on the CPU, as `train` would; "" when it trains.
#pragma once

#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/trainer.h"

namespace pa::test {

inline std::string configErrorOf(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    Config c = parseConfig(yaml, "model.yaml", sets);
    RunOptions o;
    o.device = "cpu";
    o.progress = ProgressMode::Quiet;
    o.printSummary = false;
    o.steps = 1;
    train(c, o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace pa::test
