// The C interface of libpa_mpi.so, the one piece of the project that links MPI. `train` loads it
// with dlopen only when a launcher started it as one of several ranks, so the programs run on
// machines without MPI; runtime/communicator.cpp wraps these functions as a Communicator.
// Every function returns 0 on success, else writes a message into `err` (errLen bytes).
#pragma once

#include <stddef.h>

#define PA_MPI_PLUGIN_ABI 1

extern "C" {
// The plugin's interface version: PA_MPI_PLUGIN_ABI when it was built from these declarations.
int pa_mpi_abi(void);
// MPI_Init_thread; this process's rank, the world's size, the rank among the ranks of this host,
// and the library's version string.
int pa_mpi_init(int* rank, int* size, int* localRank, char* version, size_t versionLen, char* err, size_t errLen);
// The deterministic sum: chunk k of the vector is summed by rank k in rank order, then every
// chunk goes to every rank (an all-to-all and an all-gather).
int pa_mpi_allreduce_sum_f64(double* v, size_t n, char* err, size_t errLen);
int pa_mpi_allreduce_sum_f32(float* v, size_t n, char* err, size_t errLen);
int pa_mpi_bcast(void* data, size_t bytes, int root, char* err, size_t errLen);
// `bytes` from every rank into `all` (size * bytes), on a communicator of its own; returns 2
// when the ranks have not all arrived after `timeoutSeconds`.
int pa_mpi_allgather(const void* mine, size_t bytes, void* all, double timeoutSeconds, char* err, size_t errLen);
// Waits up to `timeoutSeconds` for every rank to finish, then MPI_Finalize and returns 0;
// otherwise MPI_Abort with `code` (does not return).
int pa_mpi_finish(int code, double timeoutSeconds);
}
