/*
 * The parameter server across processes: point-to-point or one-sided?
 * (docs/ddp.md "The parameter server under MPI", issue 11 D2)
 *
 *   make && mpirun -np 2 build/bench/ps_rma [--floats 421642] [--pushes 20] [--reps 5] [--serialized]
 *
 * Rank 0 is a worker, rank 1 the server of one shard of --floats floats (the
 * cnn's gradient by default).  One round trip = push a gradient into the
 * shard and pull the fresh shard back.  Variants:
 *
 *   p2p   what src/ddp/ps_mpi.c does: the worker posts MPI_Irecv for the
 *         reply and MPI_Isend's [16-byte header | gradient]; the server
 *         receives it (MPI_ANY_SOURCE), applies an SGD step p -= lr g and
 *         sends [header | p] back; the worker waits for both
 *   rma   passive target on a window of the shard (MPI_Win_allocate):
 *         MPI_Win_lock(exclusive); MPI_Accumulate(-lr g, MPI_SUM);
 *         MPI_Win_flush; MPI_Get(p); MPI_Win_unlock.  The server only polls
 *         MPI (MPI_Iprobe) so that a component that needs target-side
 *         progress gets it.  It can do nothing but add: no momentum or
 *         AdamW state, no version or staleness (the server never sees the
 *         push), which the real server needs
 *
 * Per variant: --reps repetitions of --pushes round trips each (a barrier
 * before each repetition); prints the median and the min over repetitions
 * of the time per round trip and the rate of gradient bytes pushed.  Both
 * variants compute the same result (checked: the worker's pulled shard).
 */
#ifndef DP_WITH_MPI
#include <stdio.h>

int main(void) {
    fprintf(stderr, "ps_rma: built without MPI (apt-get install openmpi-bin libopenmpi-dev, then make)\n");
    return 1;
}
#else
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR 4 /* floats of header (16 bytes, as ps_mpi.c's) */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const float LR = 0.01f;

/* returns seconds for `pushes` round trips (rank 0's clock; the server's is ignored) */
static double run_p2p(int rank, long n, int pushes, float *g, float *p, float *buf) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int k = 0; k < pushes; k++) {
        if (rank == 0) {
            MPI_Request rq[2];
            memcpy(buf + HDR, g, sizeof(float) * (size_t)n); /* the request buffer [hdr | g], as ps_mpi.c */
            MPI_Irecv(p - HDR, (int)(n + HDR), MPI_FLOAT, 1, 2, MPI_COMM_WORLD, &rq[0]);
            MPI_Isend(buf, (int)(n + HDR), MPI_FLOAT, 1, 1, MPI_COMM_WORLD, &rq[1]);
            MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        } else {
            MPI_Status st;
            MPI_Recv(buf, (int)(n + HDR), MPI_FLOAT, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &st);
            const float *gg = buf + HDR;
            for (long i = 0; i < n; i++) p[i] -= LR * gg[i];
            memcpy(buf + HDR, p, sizeof(float) * (size_t)n);
            MPI_Send(buf, (int)(n + HDR), MPI_FLOAT, st.MPI_SOURCE, 2, MPI_COMM_WORLD);
        }
    }
    double dt = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    return dt;
}

static double run_rma(int rank, long n, int pushes, const float *g, float *pulled, float *neg, MPI_Win win) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (rank == 0) {
        for (int k = 0; k < pushes; k++) {
            for (long i = 0; i < n; i++) neg[i] = -LR * g[i]; /* the worker scales: the target can only add */
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 1, 0, win);
            MPI_Accumulate(neg, (int)n, MPI_FLOAT, 1, 0, (int)n, MPI_FLOAT, MPI_SUM, win);
            MPI_Win_flush(1, win);
            MPI_Get(pulled, (int)n, MPI_FLOAT, 1, 0, (int)n, MPI_FLOAT, win);
            MPI_Win_unlock(1, win);
        }
        int one = 1;
        MPI_Send(&one, 1, MPI_INT, 1, 3, MPI_COMM_WORLD);
    } else { /* poll until the worker says it is done */
        int flag = 0;
        MPI_Status st;
        while (!flag) MPI_Iprobe(0, 3, MPI_COMM_WORLD, &flag, &st);
        int one;
        MPI_Recv(&one, 1, MPI_INT, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    double dt = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    return dt;
}

int main(int argc, char **argv) {
    /* dptrain asks for MPI_THREAD_MULTIPLE (its messages come from another
     * thread than the collectives); --serialized asks for less, which Open
     * MPI's osc pt2pt (one-sided over point-to-point: TCP) requires */
    int prov, serialized = 0;
    for (int i = 1; i < argc; i++) serialized |= !strcmp(argv[i], "--serialized");
    MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &prov);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long n = 421642;
    int pushes = 20, reps = 5;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--floats")) n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--pushes")) pushes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    }
    if (size != 2 || n < 1 || pushes < 1 || reps < 1 || reps > 99) {
        if (rank == 0) fprintf(stderr, "ps_rma: run with mpirun -np 2; --floats, --pushes >= 1, --reps in 1..99\n");
        MPI_Finalize();
        return 1;
    }
    float *g = malloc(sizeof(float) * (size_t)n), *neg = malloc(sizeof(float) * (size_t)n);
    float *pull = malloc(sizeof(float) * (size_t)n);
    float *pbuf = malloc(sizeof(float) * (size_t)(n + HDR)), *buf = malloc(sizeof(float) * (size_t)(n + HDR));
    float *p = pbuf + HDR;
    for (long i = 0; i < n; i++) g[i] = (float)((i % 97) - 48) * 1e-3f, p[i] = 1.0f;
    memset(buf, 0, sizeof(float) * (size_t)(n + HDR));
    float *wbase;
    MPI_Win win;
    MPI_Win_allocate(rank == 1 ? (MPI_Aint)(sizeof(float) * (size_t)n) : 0, sizeof(float), MPI_INFO_NULL,
                     MPI_COMM_WORLD, &wbase, &win);
    if (rank == 1)
        for (long i = 0; i < n; i++) wbase[i] = 1.0f;
    MPI_Barrier(MPI_COMM_WORLD);
    double tp[99], tr[99];
    run_p2p(rank, n, 2, g, p, buf); /* warm-up (pages, connections) */
    run_rma(rank, n, 2, g, pull, neg, win);
    for (int r = 0; r < reps; r++) {
        tp[r] = run_p2p(rank, n, pushes, g, p, buf) / pushes;
        tr[r] = run_rma(rank, n, pushes, g, pull, neg, win) / pushes;
    }
    /* both did 2 + reps x pushes updates of the same gradient: the shards agree */
    long total = 2 + (long)reps * pushes;
    MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
    float *chk = malloc(sizeof(float) * (size_t)n);
    if (rank == 0) MPI_Get(chk, (int)n, MPI_FLOAT, 1, 0, (int)n, MPI_FLOAT, win);
    MPI_Win_unlock(1, win);
    if (rank == 0) {
        double maxdiff = 0;
        for (long i = 0; i < n; i++) {
            double d = fabs((double)chk[i] - (double)p[i]);
            if (d > maxdiff) maxdiff = d;
        }
        qsort(tp, (size_t)reps, sizeof(double), cmp_d);
        qsort(tr, (size_t)reps, sizeof(double), cmp_d);
        double mb = (double)n * 4 / 1e6;
        printf("# ps_rma: %ld floats (%.2f MB) per push, %d pushes x %d reps, thread level %s; medians (min) per "
               "round trip\n", n, mb, pushes, reps, prov == MPI_THREAD_MULTIPLE ? "multiple" : "serialized");
        printf("variant\tmedian_ms\tmin_ms\tpush_MB_per_s\n");
        printf("p2p\t%.3f\t%.3f\t%.0f\n", tp[reps / 2] * 1e3, tp[0] * 1e3, mb / tp[reps / 2]);
        printf("rma\t%.3f\t%.3f\t%.0f\n", tr[reps / 2] * 1e3, tr[0] * 1e3, mb / tr[reps / 2]);
        printf("# check: %ld updates each; max |rma shard - p2p shard| = %.3g\n", total, maxdiff);
    }
    free(chk);
    MPI_Win_free(&win);
    free(g), free(neg), free(pull), free(pbuf), free(buf);
    MPI_Finalize();
    return 0;
}
#endif
