/* Shared by the plain-MPI bench programs (bench/mpi_allreduce.c, bench/mpi_coll.c;
 * built with mpicc -DDP_BENCH_MPI). */
#ifndef DP_BENCH_MPI_BENCH_H
#define DP_BENCH_MPI_BENCH_H
#include <mpi.h>
#include <string.h>

/* The first line of MPI_Get_library_version into lib. */
static inline void mpi_library(char lib[MPI_MAX_LIBRARY_VERSION_STRING]) {
    int len;
    MPI_Get_library_version(lib, &len);
    char *nl = strchr(lib, '\n');
    if (nl) *nl = '\0';
}
#endif
