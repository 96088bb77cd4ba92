// libpa_mpi.so: the MPI calls of a data-parallel run (runtime/mpi/mpi_plugin.h).
#include "runtime/mpi/mpi_plugin.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// Collectives of the training step run on `data`; the rendezvous and the final wait on
// `control`, so that a rank that failed between two steps can never be matched against a
// gradient all-reduce of the others.
MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
int worldRank = 0, worldSize = 1;

int fail(int rc, const char* call, char* err, size_t errLen) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::snprintf(err, errLen, "%s failed: %s", call, text);
  return 1;
}

#define PA_MPI_TRY(call)                                        \
  do {                                                          \
    const int rc_ = (call);                                     \
    if (rc_ != MPI_SUCCESS) return fail(rc_, #call, err, errLen); \
  } while (0)

// Waits for `req` until `timeoutSeconds`; false when it has not completed by then.
bool waitUntil(MPI_Request* req, double timeoutSeconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
  int done = 0;
  for (;;) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

template <class T>
int allReduceSum(T* v, size_t n, MPI_Datatype type, char* err, size_t errLen) {
  if (worldSize == 1 || n == 0) return 0;
  const size_t p = static_cast<size_t>(worldSize), me = static_cast<size_t>(worldRank);
  auto begin = [&](size_t k) { return n * k / p; };
  std::vector<int> sendCounts(p), sendDispls(p), recvCounts(p), recvDispls(p);
  const int mine = static_cast<int>(begin(me + 1) - begin(me));
  for (size_t k = 0; k < p; ++k) {
    sendCounts[k] = static_cast<int>(begin(k + 1) - begin(k));
    sendDispls[k] = static_cast<int>(begin(k));
    recvCounts[k] = mine;
    recvDispls[k] = static_cast<int>(k) * mine;
  }
  std::vector<T> parts(static_cast<size_t>(mine) * p);
  PA_MPI_TRY(MPI_Alltoallv(v, sendCounts.data(), sendDispls.data(), type, parts.data(), recvCounts.data(),
                           recvDispls.data(), type, data));
  T* out = v + begin(me);
  for (int i = 0; i < mine; ++i) {
    T s = parts[static_cast<size_t>(i)];
    for (size_t k = 1; k < p; ++k) s += parts[k * static_cast<size_t>(mine) + static_cast<size_t>(i)];
    out[i] = s;
  }
  PA_MPI_TRY(MPI_Allgatherv(MPI_IN_PLACE, 0, type, v, sendCounts.data(), sendDispls.data(), type, data));
  return 0;
}

}  // namespace

extern "C" {

int pa_mpi_abi(void) { return PA_MPI_PLUGIN_ABI; }

int pa_mpi_init(int* rank, int* size, int* localRank, char* version, size_t versionLen, char* err, size_t errLen) {
  int provided = 0;
  PA_MPI_TRY(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as codes, so that the program prints one message and exits with its status.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  PA_MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &data));
  PA_MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &control));
  PA_MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &worldRank));
  PA_MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &worldSize));
  MPI_Comm host = MPI_COMM_NULL;
  PA_MPI_TRY(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, worldRank, MPI_INFO_NULL, &host));
  PA_MPI_TRY(MPI_Comm_rank(host, localRank));
  MPI_Comm_free(&host);
  *rank = worldRank;
  *size = worldSize;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::snprintf(version, versionLen, "%s", lib);
  return 0;
}

int pa_mpi_allreduce_sum_f64(double* v, size_t n, char* err, size_t errLen) {
  return allReduceSum(v, n, MPI_DOUBLE, err, errLen);
}

int pa_mpi_allreduce_sum_f32(float* v, size_t n, char* err, size_t errLen) {
  return allReduceSum(v, n, MPI_FLOAT, err, errLen);
}

int pa_mpi_bcast(void* buf, size_t bytes, int root, char* err, size_t errLen) {
  PA_MPI_TRY(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, data));
  return 0;
}

int pa_mpi_allgather(const void* mine, size_t bytes, void* all, double timeoutSeconds, char* err, size_t errLen) {
  MPI_Request req = MPI_REQUEST_NULL;
  PA_MPI_TRY(MPI_Iallgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, control, &req));
  if (!waitUntil(&req, timeoutSeconds)) {
    std::snprintf(err, errLen, "not every rank arrived within %g s", timeoutSeconds);
    return 2;
  }
  return 0;
}

int pa_mpi_finish(int code, double timeoutSeconds) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(control, &req) == MPI_SUCCESS && waitUntil(&req, timeoutSeconds)) {
    MPI_Finalize();
    return 0;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  return 1;
}

}  // extern "C"
