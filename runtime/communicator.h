// The ranks of a data-parallel run as the sessions see them: rank, size, and the few host
// collectives training needs. MPI stays behind this interface (runtime/mpi/, a plugin loaded at
// run time), so everything above runs and is tested in one process.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace pa {

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The rank among those on this machine: the GPU a rank drives.
  virtual int localRank() const = 0;
  // "single process", "Open MPI v4.1.4, ..." (the run's header).
  virtual std::string describe() const = 0;
  // Every rank's `v` summed element by element, the same bits on every rank: each element is
  // summed in rank order (0, 1, ..., size-1), whatever the launch and the network.
  virtual void allReduceSum(double* v, size_t n) = 0;
  virtual void allReduceSum(float* v, size_t n) = 0;
  // Rank `root`'s bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank's `mine`, in rank order. Throws std::runtime_error when a rank has not arrived
  // after `timeoutSeconds` (the rendezvous of a launch that went wrong must not hang).
  virtual std::vector<std::string> allGather(const std::string& mine, double timeoutSeconds) = 0;
  // Ends the process's part in the run with exit status `code`: waits up to `timeoutSeconds`
  // for every rank to finish too, then returns `code`; a rank that never comes (a failure on
  // some ranks only) ends the whole run instead, with `code`, so that no rank waits forever.
  virtual int finish(int code, double timeoutSeconds) = 0;
};

// One process: rank 0 of 1; every collective returns its input.
class SingleProcessCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int localRank() const override { return 0; }
  std::string describe() const override { return "single process"; }
  void allReduceSum(double*, size_t) override {}
  void allReduceSum(float*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<std::string> allGather(const std::string& mine, double) override { return {mine}; }
  int finish(int code, double) override { return code; }
};

// MPI through the plugin libpa_mpi.so (runtime/mpi/mpi_plugin.cpp), loaded with dlopen from
// $PA_MPI_PLUGIN, else beside the running program; initialises MPI. Throws std::runtime_error
// with why when the plugin or MPI cannot be loaded or started.
std::unique_ptr<Communicator> loadMpiCommunicator();

}  // namespace pa
