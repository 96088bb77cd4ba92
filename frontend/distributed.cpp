// Data-parallel launches: launcher detection, the rendezvous, and the replica check.
#include "frontend/distributed.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/errors.h"
#include "common/hash.h"

namespace pa {

LaunchEnv detectLaunch() {
  // Open MPI's mpirun, MPICH/Intel MPI's hydra (and srun --mpi=pmi2), MVAPICH, Slurm's srun.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end && *end == '\0' && n >= 1) return LaunchEnv{static_cast<int>(n), std::string(name) + "=" + v};
  }
  return LaunchEnv{};
}

std::shared_ptr<Communicator> startCommunicator(bool distributed) {
  const LaunchEnv launch = detectLaunch();
  if (launch.size <= 1) return distributed ? std::make_shared<SingleProcessCommunicator>() : nullptr;
#ifndef PA_HAVE_MPI_PLUGIN
  throw UserError("launched as one of " + std::to_string(launch.size) + " ranks (" + launch.variable +
                  "), but this train was built without MPI (CMake found no MPI, or -DPA_MPI=OFF): it cannot run "
                  "multi-rank; install libopenmpi-dev and rebuild (README \"Data-parallel training\"), or run one process");
#else
  std::shared_ptr<Communicator> comm;
  try {
    comm = loadMpiCommunicator();
  } catch (const std::runtime_error& e) {
    throw UserError("launched as one of " + std::to_string(launch.size) + " ranks (" + launch.variable +
                    "), but MPI cannot start: " + e.what());
  }
  if (comm->size() != launch.size)
    throw UserError("the launcher says " + std::to_string(launch.size) + " ranks (" + launch.variable + "), MPI says " +
                    std::to_string(comm->size()) + ": launch with the mpirun of the MPI this train was built with "
                    "(Open MPI), or srun --mpi=pmix");
  return comm;
#endif
}

double rendezvousTimeout() {
  const char* v = std::getenv("PA_RENDEZVOUS_TIMEOUT");
  if (v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end && *end == '\0' && s > 0) return s;
  }
  return 120.0;
}

namespace {

// "line 12: `  lr: 0.002` on rank 1, `  lr: 0.001` on rank 0".
std::string firstDifference(const std::string& a, const std::string& b, int rankA, int rankB) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ha = static_cast<bool>(std::getline(sa, la)), hb = static_cast<bool>(std::getline(sb, lb));
    if (!ha && !hb) return "";
    if (!ha) la = "(end)";
    if (!hb) lb = "(end)";
    if (la != lb)
      return "line " + std::to_string(line) + " of the resolved run: `" + la + "` on rank " + std::to_string(rankA) +
             ", `" + lb + "` on rank " + std::to_string(rankB);
  }
}

}  // namespace

void meetRanks(Communicator& comm, const std::string& job, const std::string& error) {
  const std::vector<std::string> all = comm.allGather((error.empty() ? "ok\n" : "error\n") + (error.empty() ? job : error),
                                                      rendezvousTimeout());
  const std::string n = std::to_string(comm.size());
  // Failures first: the same message everywhere when every rank failed alike, else the first
  // failing rank's, named.
  int failed = -1, failures = 0;
  bool alike = true;
  for (int r = 0; r < comm.size(); ++r) {
    if (all[static_cast<size_t>(r)].rfind("error\n", 0) != 0) continue;
    if (failed < 0) failed = r;
    else if (all[static_cast<size_t>(r)] != all[static_cast<size_t>(failed)]) alike = false;
    ++failures;
  }
  if (failed >= 0) {
    const std::string message = all[static_cast<size_t>(failed)].substr(6);
    if (failures == comm.size() && alike) throw UserError(message);
    throw UserError("rank " + std::to_string(failed) + " of " + n + " failed: " + message);
  }
  for (int r = 1; r < comm.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0])
      throw UserError("the ranks disagree on the run (each rank must get the same config, --set and flags): rank " +
                      std::to_string(r) + " of " + n + " differs from rank 0 at " +
                      firstDifference(all[static_cast<size_t>(r)].substr(3), all[0].substr(3), r, 0));
}

uint64_t parameterHash(const std::map<std::string, std::vector<double>>& params) {
  uint64_t h = kFnvBasis;
  for (const auto& [name, v] : params) {
    h = fnv1a(name.data(), name.size(), h);
    h = fnv1a(v.data(), v.size() * sizeof(double), h);
  }
  return h;
}

void checkReplicasAgree(Communicator& comm, const std::map<std::string, std::vector<double>>& params,
                        const std::string& when) {
  char mine[32];
  std::snprintf(mine, sizeof mine, "%016llx", static_cast<unsigned long long>(parameterHash(params)));
  const std::vector<std::string> all = comm.allGather(mine, rendezvousTimeout());
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      throw std::runtime_error("rank " + std::to_string(r) + "'s parameters differ from rank 0's " + when + " (hash " +
                               all[r] + " against " + all[0] + "): the replicas have diverged");
}

}  // namespace pa
