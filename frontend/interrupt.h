// Ctrl-C during training: the step in flight finishes, the run is summarised, `train` exits 130.
#pragma once

namespace pa {

// While alive, SIGINT and SIGTERM set a flag instead of ending the process; a second signal ends
// it at once (the handler restores the default action when it fires). The previous handlers come
// back on destruction. One guard at a time.
class InterruptGuard {
public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  bool interrupted() const;
  int signal() const;  // the signal that arrived, 0 when none
};

}  // namespace pa
