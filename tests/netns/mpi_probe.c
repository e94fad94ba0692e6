/* A small MPI program for the namespace cluster (tests/netns/):
 *
 *   mpi_probe ns              every rank reports its host name, pid, network namespace
 *                             (readlink /proc/self/ns/net) and the cores it may run on (its
 *                             affinity mask, sched_getaffinity, as a list "0,2,3"); rank 0
 *                             prints one line per rank:
 *                             "rank R pid P host H netns NS cpus LIST"
 *   mpi_probe bw [MB] [ITERS] ping-pong of MB-MiB messages between ranks 0 and 1; prints
 *                             "bw MB/s <one-way MB/s>" (MB = 10^6 bytes) and the Gbit/s
 *   mpi_probe loop [SECONDS]  all-reduce 1 MiB over and over for SECONDS (for kill tests);
 *                             every rank prints "ready rank R pid P" once it has started
 *
 * Build: mpicc -O2 -o mpi_probe tests/netns/mpi_probe.c */
#define _GNU_SOURCE /* sched_getaffinity, CPU_ISSET */
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

/* the cores this process may run on, "0,1,5" ("none" when the mask cannot be read): what the
 * launcher's binding and the cluster's per-host cpu set leave to the rank */
static void cpu_list(char *out, size_t cap) {
    cpu_set_t set;
    size_t len = 0;
    out[0] = 0;
    if (sched_getaffinity(0, sizeof set, &set)) {
        snprintf(out, cap, "none");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && len + 8 < cap; c++)
        if (CPU_ISSET(c, &set)) len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? "," : "", c);
    if (!len) snprintf(out, cap, "none");
}

static int do_ns(void) {
    char line[1024], ns[128] = "?", host[128] = "?", cpus[512];
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    cpu_list(cpus, sizeof cpus);
    snprintf(line, sizeof line, "rank %d pid %d host %s netns %s cpus %s", rank, (int)getpid(), host, ns, cpus);
    char *all = rank == 0 ? malloc((size_t)size * sizeof line) : NULL;
    MPI_Gather(line, sizeof line, MPI_CHAR, all, sizeof line, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (int r = 0; r < size; r++) printf("%s\n", all + (size_t)r * sizeof line);
        free(all);
    }
    return 0;
}

static int do_bw(int argc, char **argv) {
    double mb = argc > 2 ? atof(argv[2]) : 4;
    int iters = argc > 3 ? atoi(argv[3]) : 10;
    int len = (int)(mb * 1048576);
    char *buf = calloc((size_t)len, 1);
    if (size < 2 || !buf) {
        if (rank == 0) fprintf(stderr, "mpi_probe bw: needs 2 ranks and memory\n");
        return 1;
    }
    double t0 = 0;
    for (int i = -1; i < iters; i++) { /* iteration -1 warms up the connection */
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank == 0) {
            MPI_Send(buf, len, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, len, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, len, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, len, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    if (rank == 0) {
        double bytes = 2.0 * iters * len; /* one-way bytes moved in total */
        printf("bw MB/s %.1f Gbit/s %.3f (%d x %.1f MiB ping-pong, %.3f s)\n", bytes / t / 1e6,
               bytes * 8 / t / 1e9, iters, mb, t);
    }
    free(buf);
    return 0;
}

static int do_loop(int argc, char **argv) {
    double seconds = argc > 2 ? atof(argv[2]) : 60;
    int n = 262144;
    float *a = calloc((size_t)n, sizeof *a), *b = calloc((size_t)n, sizeof *b);
    printf("ready rank %d pid %d\n", rank, (int)getpid());
    fflush(stdout);
    double t0 = MPI_Wtime();
    int go = 1;
    while (go) {
        MPI_Allreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        go = MPI_Wtime() - t0 < seconds;
        MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD); /* every rank stops at the same step */
    }
    free(a);
    free(b);
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "ns";
    int rc;
    if (!strcmp(mode, "ns")) rc = do_ns();
    else if (!strcmp(mode, "bw")) rc = do_bw(argc, argv);
    else if (!strcmp(mode, "loop")) rc = do_loop(argc, argv);
    else {
        if (rank == 0) fprintf(stderr, "mpi_probe: unknown mode %s (ns | bw | loop)\n", mode);
        rc = 2;
    }
    fflush(stdout);
    if (rc) MPI_Abort(MPI_COMM_WORLD, rc);
    MPI_Finalize();
    return 0;
}
