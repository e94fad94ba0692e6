/*
 * Open MPI's own reduce-scatter, all-gather and all-reduce (float sum, in
 * place, the blocks of dp_comm_split: counts differ by at most one), each
 * blocking and nonblocking, timed like bench/mpi_allreduce.c, for
 * bench/reduce_scatter.sh: what dptrain's mpi backend calls with --algo
 * native, without dptrain around it.
 *
 *   mpicc -O2 -DDP_BENCH_MPI -o mpi_coll bench/mpi_coll.c
 *   mpirun -np P ./mpi_coll [--bytes 2680000] [--iters 20] [--warmup 2] [OP...]
 *
 * OP (default: all of them, one row each):
 *   rs     MPI_Reduce_scatter(MPI_IN_PLACE, counts)     (tuned: ring above 256 KB here)
 *   irs    MPI_Ireduce_scatter(MPI_IN_PLACE, counts) + MPI_Wait   (libnbc)
 *   rsb    MPI_Reduce_scatter_block (equal blocks: bytes rounded down to P floats)
 *   irsb   MPI_Ireduce_scatter_block + MPI_Wait
 *   ag     MPI_Allgatherv(MPI_IN_PLACE)                 iag   MPI_Iallgatherv + MPI_Wait
 *   ar     MPI_Allreduce(MPI_IN_PLACE)                  iar   MPI_Iallreduce + MPI_Wait
 * Per op: one checked call, warm-up calls, then N timed calls each after an
 * MPI_Barrier; an iteration's time is the slowest rank's; prints the median
 * and the fastest, and the bytes each rank sends at the least (reduce-scatter
 * and all-gather (P-1)/P of the buffer, all-reduce twice that), so that
 * time x link rate can be set beside it.
 *
 * The Makefile compiles every C file in bench/ with the plain compiler; without
 * -DDP_BENCH_MPI this file builds a stub that says how to build it.
 */
#ifndef DP_BENCH_MPI
#include <stdio.h>

int main(void) {
    fprintf(stderr, "mpi_coll: build with 'mpicc -O2 -DDP_BENCH_MPI' "
                    "(bench/reduce_scatter.sh does)\n");
    return 1;
}
#else
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_bench.h"

#define MAX_ITERS 500

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* dp_comm_split's blocks: the first count % P get one more element */
static void split(int count, int P, int *counts, int *displs) {
    for (int q = 0, o = 0; q < P; q++) {
        counts[q] = count / P + (q < count % P);
        displs[q] = o;
        o += counts[q];
    }
}

static const char *const OPS[] = {"rs", "irs", "rsb", "irsb", "ag", "iag", "ar", "iar"};
#define NOPS ((int)(sizeof OPS / sizeof OPS[0]))

/* One call of op k on buf (count floats). */
static void run_op(int k, float *buf, int count, const int *counts, const int *displs) {
    MPI_Request rq = MPI_REQUEST_NULL;
    MPI_Comm w = MPI_COMM_WORLD;
    int P, blk;
    MPI_Comm_size(w, &P);
    blk = count / P;
    switch (k) {
    case 0: MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, w); break;
    case 1: MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, w, &rq); break;
    case 2: MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, blk, MPI_FLOAT, MPI_SUM, w); break;
    case 3: MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, blk, MPI_FLOAT, MPI_SUM, w, &rq); break;
    case 4: MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, counts, displs, MPI_FLOAT, w); break;
    case 5: MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, counts, displs, MPI_FLOAT, w, &rq); break;
    case 6: MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, w); break;
    default: MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, w, &rq); break;
    }
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    long long bytes = 2680000;
    int iters = 20, warmup = 2, want[NOPS] = {0}, any = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--bytes")) bytes = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--iters")) iters = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--warmup")) warmup = atoi(argv[++i]);
        else {
            int k = 0;
            while (k < NOPS && strcmp(argv[i], OPS[k])) k++;
            if (k == NOPS) {
                if (!rank) fprintf(stderr, "mpi_coll: unknown option or op '%s'\n", argv[i]);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            want[k] = any = 1;
        }
    }
    if (bytes < 4 * P || bytes > (1LL << 32) || iters < 1 || iters > MAX_ITERS || warmup < 0) {
        if (!rank) fprintf(stderr, "mpi_coll: bad options\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int count = (int)(bytes / 4);
    float *buf = malloc((size_t)count * 4);
    int *counts = malloc(sizeof(int) * (size_t)P), *displs = malloc(sizeof(int) * (size_t)P);
    if (!buf || !counts || !displs) MPI_Abort(MPI_COMM_WORLD, 1);
    split(count, P, counts, displs);
    double times[MAX_ITERS], worst[MAX_ITERS];
    if (!rank) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        mpi_library(lib);
        printf("# mpi_coll: %s, %d processes, %lld bytes (MPI_FLOAT MPI_SUM, in place)\n", lib, P,
               bytes);
        printf("%6s %12s %6s %12s %12s %14s %12s\n", "op", "bytes", "iters", "median_us",
               "best_us", "sent_per_rank", "MB/s_sent");
        fflush(stdout);
    }
    for (int k = 0; k < NOPS; k++) {
        if (any && !want[k]) continue;
        /* checked call: every rank fills rank+1; the sum is P(P+1)/2; an
         * all-gather's block q holds q+1 after */
        for (int i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        run_op(k, buf, count, counts, displs);
        float sum = (float)(P * (P + 1) / 2);
        int bad = 0;
        if (k < 4) bad = buf[0] != sum || buf[(k < 2 ? counts[rank] : count / P) - 1] != sum;
        else if (k < 6)
            for (int q = 0; q < P; q++) bad |= buf[displs[q]] != (float)(q + 1);
        else bad = buf[0] != sum || buf[count - 1] != sum;
        if (bad) {
            fprintf(stderr, "mpi_coll: rank %d: wrong result of %s\n", rank, OPS[k]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int i = 0; i < warmup + iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            run_op(k, buf, count, counts, displs);
            if (i >= warmup) times[i - warmup] = MPI_Wtime() - t0;
        }
        MPI_Reduce(times, worst, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (!rank) {
            qsort(worst, (size_t)iters, sizeof(double), cmp_double);
            double med = iters % 2 ? worst[iters / 2]
                                   : 0.5 * (worst[iters / 2 - 1] + worst[iters / 2]);
            double sent = (double)bytes * (P - 1) / P * (k >= 6 ? 2 : 1);
            printf("%6s %12lld %6d %12.1f %12.1f %14.0f %12.1f\n", OPS[k], bytes, iters,
                   med * 1e6, worst[0] * 1e6, sent, sent / med / 1e6);
            fflush(stdout);
        }
    }
    free(buf), free(counts), free(displs);
    MPI_Finalize();
    return 0;
}
#endif
