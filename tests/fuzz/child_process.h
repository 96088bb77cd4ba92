// Runs programs as child processes, a few at a time, each with a wall-clock limit, and reports
// how each one ended (exit code, signal, or killed at the limit) with its stdout and stderr.
#pragma once

#include <string>
#include <vector>

namespace pa::fuzz {

struct ChildJob {
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::string dir;                // an existing folder of its own: stdout and stderr go to files there
};

struct ChildResult {
  bool timedOut = false;
  int signal = 0;     // the signal that ended it (0: it exited)
  int exitCode = -1;  // when it exited
  double seconds = 0.0;
  std::string out, err;
};

struct ChildLimits {
  double seconds = 20.0;
  size_t addressSpaceBytes = 0;  // RLIMIT_AS; 0 leaves it (sanitizers reserve terabytes of it)
  std::vector<std::string> env;  // the whole environment, "KEY=value"
};

// Runs every job, at most `parallel` at once; results in the jobs' order.
std::vector<ChildResult> runChildren(const std::vector<ChildJob>& jobs, int parallel, const ChildLimits& limits);

// The current environment with `overrides` ("KEY=value") put in place of the same keys.
std::vector<std::string> environmentWith(const std::vector<std::string>& overrides);

}  // namespace pa::fuzz
