/*
 * Open MPI's own MPI_Allreduce (sum, float, in place) timed the way
 * `dptrain bench allreduce` times its thread backend, for the side-by-side
 * run of bench/allreduce_vs_mpi.sh:
 *
 *   mpicc -O2 -DDP_BENCH_MPI -o mpi_allreduce bench/mpi_allreduce.c
 *   mpirun -np 2 ./mpi_allreduce [--min-bytes 4K] [--max-bytes 256M] [--iters N] [--mallopt]
 *
 * Method (the same as dptrain's): one buffer of the largest size per rank,
 * allocated once, advised for huge pages and touched before timing; per size
 * one checked call (every rank fills rank+1, the sum must be P(P+1)/2), two
 * warm-up calls, then N timed calls each after an MPI_Barrier; an iteration's
 * time is the slowest rank's; the figure is the median.  N defaults to about
 * 0.5 s of calls (5..500), from the slowest warm-up call.  Prints the same
 * columns as dptrain.
 *
 * --mallopt applies the malloc settings of dptrain's main() (freed memory
 * stays in the heap: M_MMAP_THRESHOLD and M_TRIM_THRESHOLD 1 GiB), so that
 * the temporary buffers Open MPI allocates per call are not fresh pages each
 * time (docs/architecture.md §3): the same conditions as the MPI_Allreduce that dptrain's
 * mpi backend calls.
 *
 * The Makefile compiles every C file in bench/ with the plain compiler; without
 * -DDP_BENCH_MPI this file builds a stub that says how to build it.
 */
#ifndef DP_BENCH_MPI
#include <stdio.h>

int main(void) {
    fprintf(stderr, "mpi_allreduce: build with 'mpicc -O2 -DDP_BENCH_MPI' "
                    "(bench/allreduce_vs_mpi.sh does)\n");
    return 1;
}
#else
#include <malloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_bench.h"
#include <sys/mman.h>

static long long parse_bytes(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    else if (*end == 'G' || *end == 'g') v <<= 30;
    return v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define MAX_ITERS 500

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    long long min_bytes = 4 << 10, max_bytes = 256LL << 20;
    int iters_opt = 0, warmup = 2;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mallopt")) {
            mallopt(M_MMAP_THRESHOLD, 1 << 30);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mallopt")) {
            i--;
            continue;
        }
        if (!strcmp(argv[i], "--min-bytes")) min_bytes = parse_bytes(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-bytes")) max_bytes = parse_bytes(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters_opt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
    }
    if (min_bytes < 4 || max_bytes < min_bytes || iters_opt > MAX_ITERS) {
        if (!rank) fprintf(stderr, "mpi_allreduce: bad options\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    size_t cap = (size_t)max_bytes;
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 2 << 20, cap)) MPI_Abort(MPI_COMM_WORLD, 1);
    madvise(buf, cap, MADV_HUGEPAGE);
    memset(buf, 0, cap);
    double times[MAX_ITERS], worst[MAX_ITERS];
    if (!rank) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        mpi_library(lib);
        printf("# mpi_allreduce: %s, %d processes, MPI_FLOAT MPI_SUM in place\n", lib, P);
        printf("%12s %12s %6s %8s %12s %12s %12s %12s\n", "bytes", "count", "iters", "algo",
               "time_us", "algbw_GB/s", "busbw_GB/s", "best_busbw");
        fflush(stdout);
    }
    for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        int count = (int)(bytes / 4);
        for (int i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        float want = (float)(P * (P + 1) / 2);
        if (buf[0] != want || buf[count - 1] != want) {
            fprintf(stderr, "mpi_allreduce: wrong result at %lld bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double wslow = 0;
        for (int i = 0; i < warmup; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0;
            if (dt > wslow) wslow = dt;
        }
        MPI_Allreduce(MPI_IN_PLACE, &wslow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        int iters = iters_opt;
        if (!iters) {
            double g = wslow > 0 ? 0.5 / wslow : MAX_ITERS;
            iters = g > MAX_ITERS ? MAX_ITERS : g < 5 ? 5 : (int)g;
        }
        for (int i = 0; i < iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            times[i] = MPI_Wtime() - t0;
        }
        MPI_Reduce(times, worst, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (!rank) {
            qsort(worst, (size_t)iters, sizeof(double), cmp_double);
            double med = iters % 2 ? worst[iters / 2]
                                   : 0.5 * (worst[iters / 2 - 1] + worst[iters / 2]);
            double algbw = (double)bytes / med;
            printf("%12lld %12d %6d %8s %12.2f %12.3f %12.3f %12.3f\n", bytes, count, iters, "mpi",
                   med * 1e6, algbw / 1e9, algbw * 2.0 * (P - 1) / P / 1e9,
                   (double)bytes / worst[0] * 2.0 * (P - 1) / P / 1e9);
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
#endif
