// SIGINT / SIGTERM as a flag the training loop reads between steps.
#include "frontend/interrupt.h"

#include <csignal>

namespace pa {

namespace {

volatile std::sig_atomic_t gSignal = 0;
struct sigaction gOldInt, gOldTerm;

extern "C" void onInterrupt(int sig) {
  gSignal = sig;
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}

}  // namespace

InterruptGuard::InterruptGuard() {
  gSignal = 0;
  struct sigaction sa = {};
  sa.sa_handler = onInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &gOldInt);
  sigaction(SIGTERM, &sa, &gOldTerm);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &gOldInt, nullptr);
  sigaction(SIGTERM, &gOldTerm, nullptr);
}

bool InterruptGuard::interrupted() const { return gSignal != 0; }
int InterruptGuard::signal() const { return gSignal; }

}  // namespace pa
