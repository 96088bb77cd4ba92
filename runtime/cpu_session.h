// The CPU session: the training and validation graphs on CpuExecutor, Adam on the host.
#pragma once

#include <memory>

#include "runtime/session.h"

namespace pa {

// Runs in double for precision fp64, else in float (tf32 as exact fp32, bf16 emulated by the
// executor's rounding of every bf16 value it stores).
std::unique_ptr<Session> makeCpuSession(SessionSpec spec);

}  // namespace pa
