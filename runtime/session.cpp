// The learning-rate schedule shared by the sessions and the training loop's reports.
#include "runtime/session.h"

#include <algorithm>
#include <cmath>

namespace pa {

double LrSchedule::at(int64_t step, int64_t total) const {
  if (warmupSteps > 0 && step <= warmupSteps) return lr * static_cast<double>(step) / static_cast<double>(warmupSteps);
  if (cosine) {
    const double span = static_cast<double>(std::max<int64_t>(1, total - warmupSteps));
    const double prog = std::min(1.0, static_cast<double>(step - warmupSteps) / span);
    return lr * 0.5 * (1.0 + std::cos(3.141592653589793 * prog));
  }
  return lr;
}

}  // namespace pa
