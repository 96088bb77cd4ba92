// Data-parallel launches (README "Data-parallel training"): which launcher started this process
// as which rank, the communicator it asks for, and the checks that every rank runs the same job.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace pa {

// What the environment says about this process: launched by mpirun/srun as one of `size` ranks
// (size 1 otherwise); `variable` names the variable that said so ("OMPI_COMM_WORLD_SIZE=2").
struct LaunchEnv {
  int size = 1;
  std::string variable;
};
LaunchEnv detectLaunch();

// The communicator of this run: MPI when a launcher started several ranks; the single-process
// one when `distributed` (--distributed) asks for the data-parallel path with one rank; else null.
// Throws UserError when several ranks were launched and this build or machine has no MPI.
std::shared_ptr<Communicator> startCommunicator(bool distributed);

// Seconds a rank waits for the others at the rendezvous: $PA_RENDEZVOUS_TIMEOUT, else 120.
double rendezvousTimeout();

// The launch's rendezvous, once every rank has read its config and command line: `job` is this
// rank's description of the run (the resolved config and the flags that change a step) and
// `error` what went wrong on this rank before it got here ("" when nothing did). Throws UserError
// with the same message on every rank when any rank failed or two ranks' jobs differ.
void meetRanks(Communicator& comm, const std::string& job, const std::string& error);

// FNV-1a over every parameter's values, by name: equal on every rank of a healthy run.
uint64_t parameterHash(const std::map<std::string, std::vector<double>>& params);
// Throws std::runtime_error naming the first rank whose parameters differ from rank 0's.
void checkReplicasAgree(Communicator& comm, const std::map<std::string, std::vector<double>>& params,
                        const std::string& when);

}  // namespace pa
