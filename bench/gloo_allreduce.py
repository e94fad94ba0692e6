#!/usr/bin/python3
"""PyTorch 1.13 gloo all-reduce (sum, float32, in place), timed the way
`dptrain bench allreduce` times its thread backend; part of
bench/allreduce_vs_mpi.sh.

    /usr/bin/python3 bench/gloo_allreduce.py [--workers 2] [--min-bytes 4K]
        [--max-bytes 256M] [--iters N] [--threads 1]

Method (the same as dptrain's and bench/mpi_allreduce.c's): `--workers`
processes (torch.multiprocessing.spawn) joined by init_method file://, one
tensor of the largest size per rank, filled before timing and reused (each
size is a view of its first elements); per size one checked call (rank+1
filled, the sum must be P(P+1)/2), two warm-up calls, then N timed calls each
after dist.barrier(); an iteration's time is the slowest rank's; the figure is
the median.  N defaults to about 0.5 s of calls (5..500) from the slowest
warm-up call.  Prints the same columns as dptrain.

Threads: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS are set to
--threads before torch is imported (torch.set_num_threads alone is not enough
here, see docs/architecture.md section 3).
"""
import argparse
import os
import sys
import tempfile
import time

MAX_ITERS = 500


def parse_bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in mult:
        return int(s[:-1]) * mult[s[-1]]
    return int(s)


def worker(rank, args, init_file):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=args.workers)
    P = args.workers
    cap = args.max_bytes // 4
    buf = torch.zeros(cap, dtype=torch.float32)
    if rank == 0:
        print("# gloo_allreduce: torch %s, gloo, %d processes, float32 sum in place, "
              "%d thread(s) each" % (torch.__version__, P, args.threads))
        print("%12s %12s %6s %8s %12s %12s %12s %12s" % (
            "bytes", "count", "iters", "algo", "time_us", "algbw_GB/s", "busbw_GB/s", "best_busbw"))
        sys.stdout.flush()
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        count = nbytes // 4
        t = buf[:count]
        t.fill_(rank + 1)
        dist.all_reduce(t)
        want = P * (P + 1) / 2
        if t[0].item() != want or t[-1].item() != want:
            raise SystemExit("gloo_allreduce: wrong result at %d bytes" % nbytes)
        wslow = 0.0
        for _ in range(args.warmup):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            wslow = max(wslow, time.perf_counter() - t0)
        w = torch.tensor([wslow], dtype=torch.float64)
        dist.all_reduce(w, op=dist.ReduceOp.MAX)
        iters = args.iters
        if not iters:
            g = 0.5 / w.item() if w.item() > 0 else MAX_ITERS
            iters = int(min(MAX_ITERS, max(5, g)))
        times = torch.zeros(iters, dtype=torch.float64)
        for i in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times[i] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            med = times.median().item() if iters % 2 else \
                0.5 * sum(sorted(times.tolist())[iters // 2 - 1:iters // 2 + 1])
            algbw = nbytes / med
            best = nbytes / times.min().item() * 2 * (P - 1) / P
            print("%12d %12d %6d %8s %12.2f %12.3f %12.3f %12.3f" % (
                nbytes, count, iters, "gloo", med * 1e6, algbw / 1e9, algbw * 2 * (P - 1) / P / 1e9,
                best / 1e9))
            sys.stdout.flush()
        nbytes *= 4
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--min-bytes", type=parse_bytes, default=4 << 10)
    ap.add_argument("--max-bytes", type=parse_bytes, default=256 << 20)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.iters > MAX_ITERS:
        ap.error("--iters is at most %d" % MAX_ITERS)
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(args.threads)
    import torch.multiprocessing as mp

    fd, init_file = tempfile.mkstemp(prefix="gloo_allreduce.")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    try:
        mp.spawn(worker, args=(args, init_file), nprocs=args.workers, join=True)
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)


if __name__ == "__main__":
    main()
