#!/usr/bin/python3
"""PyTorch 1.13 DistributedDataParallel peer of `dptrain train --workers W`.

Run it with /usr/bin/python3 (Debian's python3-torch and python3-numpy); the
`python3` first on PATH may be a pyenv interpreter without torch.

    /usr/bin/python3 bench/pytorch_ddp.py --model cnn --world 2 --max-steps 150 --no-eval
    /usr/bin/python3 bench/pytorch_ddp.py --model mlp --world 1 --max-steps 400 --no-eval

The script launches its own W worker processes (subprocesses of itself with
--rank r; the launcher does not import torch).  Each rank:

  * pins its thread pools to --threads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
    MKL_NUM_THREADS before torch is imported, torch.set_num_threads, one
    inter-op thread);
  * joins a gloo process group, init_method tcp://127.0.0.1:PORT (a free port
    picked by the launcher unless --port is given), over the loopback device
    (GLOO_SOCKET_IFNAME=lo unless set);
  * builds the model and loads the data exactly as bench/pytorch_train.py does
    (the models, the data loader and the schedule are imported from there, so
    the two scripts cannot drift apart), with the same seed on every rank, so
    the initial replicas are identical (DDP also broadcasts rank 0's weights);
  * wraps the model in DDP(model) with the defaults (bucket_cap_mb=25,
    broadcast_buffers=True, gradient_as_bucket_view=False);
  * draws the epoch's permutation from the shared seed (the same on every rank,
    no communication), cuts it into global batches of --batch samples and takes
    its contiguous share of each global batch, as dptrain does: G/W samples, one
    more for the first G mod W ranks (torch.tensor_split).  The loss is the
    per-sample sum scaled by W/G, so DDP's average over the ranks is exactly the
    mean loss over the global batch however the batch was split.  A global batch
    smaller than W (some rank would get nothing) is skipped on every rank.

With --world 1 the model is trained without DDP and without a process group
(plain PyTorch, the same loop), the baseline for the scaling efficiency
throughput(W) / (W x throughput(1)).  --ddp-at-1 keeps DDP with a one-rank group.

BatchNorm (resnet) stays local to each rank: SyncBatchNorm needs CUDA in
PyTorch 1.13.  dptrain synchronises BatchNorm statistics across its workers.

Throughput is measured on rank 0 as pytorch_train.py and dptrain measure it:
global samples over the wall time from the end of step 5 to the end of the last
step, evaluation excluded, batch preparation included.  Evaluation runs on rank 0
only (on the full test set or --test-limit).  At the end rank 0 prints:

    RESULT model=cnn world=2 threads=1 samples_per_s=1234.5 test_acc=nan epochs=1 steps=150 time_s=...
"""
import argparse
import math
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="directory with train-*/t10k-* IDX files, plain or .gz")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "resnet"])
    p.add_argument("--world", type=int, default=2, help="number of processes (ranks) [2]")
    p.add_argument("--threads", type=int, default=1, help="compute threads per process [1]")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=128, help="global batch size, split over the ranks [128]")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    p.add_argument("--warmup", type=int, default=0, help="cosine: linear warmup steps")
    p.add_argument("--min-lr", type=float, default=0.0, help="cosine: final learning rate")
    p.add_argument("--crop-pad", type=int, default=0)
    p.add_argument("--hflip", action="store_true")
    p.add_argument("--max-steps", type=int, default=0, help="stop after N global steps in total (0: off)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training samples")
    p.add_argument("--test-limit", type=int, default=0, help="evaluate on the first N test samples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every-epoch", action="store_true",
                   help="evaluate on the test set after every epoch (not only at the end)")
    p.add_argument("--eval-batch", type=int, default=0, help="evaluation batch size [--batch]")
    p.add_argument("--no-eval", action="store_true", help="skip the final evaluation (speed runs)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb [25, the default]")
    p.add_argument("--ddp-at-1", action="store_true", help="with --world 1: still wrap the model in DDP")
    p.add_argument("--port", type=int, default=0, help="TCP port of the rendezvous [a free one]")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="address of rank 0's rendezvous [127.0.0.1]; with ranks started by hand (--rank) on "
                        "other hosts, e.g. bench/compression.sh's emulated hosts")
    p.add_argument("--comm-hook", default="none", choices=["none", "bf16", "fp16", "powersgd"],
                   help="DDP communication hook from torch.distributed.algorithms.ddp_comm_hooks: "
                        "bf16_compress_hook, fp16_compress_hook or powerSGD_hook [none]")
    p.add_argument("--powersgd-rank", type=int, default=4, help="powerSGD_hook's matrix_approximation_rank [4]")
    p.add_argument("--powersgd-start", type=int, default=2,
                   help="powerSGD_hook's start_powerSGD_iter (plain all-reduce before; PyTorch needs >= 2 "
                        "with error feedback) [2]")
    p.add_argument("--timeout", type=float, default=1800, help="collective timeout in seconds [1800]")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the launcher
    return p.parse_args(argv)


# ---- launcher (no torch here) --------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    if args.world < 1:
        print("pytorch_ddp: error: --world must be at least 1", file=sys.stderr)
        return 2
    port = args.port or free_port()
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = []
    for r in range(args.world):
        cmd = [sys.executable, os.path.abspath(__file__)] + argv + ["--rank", str(r), "--port", str(port)]
        procs.append(subprocess.Popen(cmd, env=env))
    rc = 0
    try:
        pending = list(procs)
        while pending:
            for pr in list(pending):
                code = pr.poll()
                if code is None:
                    continue
                pending.remove(pr)
                if code != 0 and rc == 0:
                    rc = code
                    # One rank failed: the others would wait for it until the timeout.
                    for other in pending:
                        other.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for pr in procs:
            pr.terminate()
        rc = 130
    for pr in procs:
        pr.wait()
    return rc if rc >= 0 else 1


# ---- worker ----------------------------------------------------------------------------

def worker(args):
    # Pin every thread pool before torch is imported (pytorch_train.py does the same
    # at import time from its own --threads, which we hand it below).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    # Import the models, the data loader and the schedule from pytorch_train.py.  It
    # parses sys.argv when imported, so hand it a command line of its own.
    sys.path.insert(0, HERE)
    saved_argv = sys.argv
    sys.argv = [os.path.join(HERE, "pytorch_train.py"), "--threads", str(args.threads)]
    try:
        import pytorch_train as pt
    finally:
        sys.argv = saved_argv
    import datetime
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = args.rank, args.world
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    use_pg = world > 1 or args.ddp_at_1
    if use_pg:
        dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=args.timeout))

    torch.manual_seed(args.seed)                       # same initial weights on every rank
    gen = torch.Generator().manual_seed(args.seed)     # same permutation on every rank
    aug_gen = torch.Generator().manual_seed(args.seed * 1000003 + rank)  # per-rank augmentation

    t_load = time.perf_counter()
    xtr, ytr = pt.load_split(args.data, "train", args.train_limit)
    if rank == 0:
        xte, yte = pt.load_split(args.data, "t10k", args.test_limit)
    t_load = time.perf_counter() - t_load

    net = pt.build_model(args.model)
    nparams = sum(p.numel() for p in net.parameters())
    model = DDP(net, bucket_cap_mb=args.bucket_cap_mb) if use_pg else net
    if use_pg and args.comm_hook != "none":
        # PyTorch's own hooks: bf16/fp16 cast each bucket and all-reduce it at 16 bits;
        # PowerSGD (rank r, error feedback, warm start, min_compression_rate 2) as its docs set it up
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        if args.comm_hook == "powersgd":
            st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                             start_powerSGD_iter=args.powersgd_start, random_seed=args.seed)
            model.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
        else:
            model.register_comm_hook(None, default_hooks.bf16_compress_hook if args.comm_hook == "bf16"
                                     else default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                          weight_decay=args.weight_decay)
    n = xtr.shape[0]
    steps_per_epoch = (n + args.batch - 1) // args.batch
    total_steps = steps_per_epoch * args.epochs
    if rank == 0:
        print(f"pytorch {torch.__version__}: model {args.model} ({nparams} parameters), global batch "
              f"{args.batch} over {world} process(es){' (DDP, gloo)' if use_pg else ' (no DDP)'}, "
              f"comm hook {args.comm_hook}, "
              f"sgd lr {args.lr} momentum {args.momentum}{' nesterov' if args.nesterov else ''} "
              f"wd {args.weight_decay} schedule {args.schedule}, {args.threads} thread(s) per process "
              f"(torch {torch.get_num_threads()}), {n} train / {xte.shape[0]} test samples "
              f"(loaded in {t_load:.1f}s)", flush=True)
    if use_pg:
        dist.barrier()

    model.train()
    step = 0
    tp_time, tp_samples = 0.0, 0
    t_run = time.perf_counter()
    last_end = t_run
    test_acc, test_loss = float("nan"), float("nan")
    epochs_done = 0
    stop = False
    lr = args.lr
    for epoch in range(args.epochs):
        t_ep = time.perf_counter()
        ep_train_time = 0.0
        perm = torch.randperm(n, generator=gen)
        loss_sum, correct, seen, gseen = 0.0, 0, 0, 0
        for i in range(0, n, args.batch):
            t0 = time.perf_counter()
            gidx = perm[i:i + args.batch]
            g = gidx.shape[0]
            if g < world:
                continue  # a rank would get no sample: skipped on every rank alike
            idx = torch.tensor_split(gidx, world)[rank]
            xb, yb = xtr.index_select(0, idx), ytr.index_select(0, idx)
            if args.crop_pad or args.hflip:
                xb = pt.augment(xb, args.crop_pad, args.hflip, aug_gen)
            lr = pt.lr_at(args, step, total_steps)
            for grp in opt.param_groups:
                grp["lr"] = lr
            out = model(xb)
            # Sum over the share, scaled so that DDP's mean over the ranks is the global mean.
            loss = F.cross_entropy(out, yb, reduction="sum") * (world / g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                loss_sum += loss.item() * g / world
                correct += (out.argmax(1) == yb).sum().item()
                seen += xb.shape[0]
                gseen += g
            t1 = time.perf_counter()
            step += 1
            ep_train_time += t1 - t0
            if step > 5:
                tp_time += t1 - last_end
                tp_samples += g
            last_end = t1
            if not math.isfinite(loss_sum):
                print(f"error: rank {rank}: loss is not finite at step {step}", file=sys.stderr)
                return 1
            if args.max_steps and step >= args.max_steps:
                stop = True
                break
        if seen == 0:
            break
        epochs_done += 1
        last = epoch == args.epochs - 1 or stop
        if rank == 0:
            if args.eval_every_epoch or (last and not args.no_eval):
                # the bare module: DDP's forward would broadcast buffers to ranks that are not there
                test_acc, test_loss = pt.evaluate(net, xte, yte, args.eval_batch or args.batch)
            # train loss/acc: rank 0's share (loss_sum is its share of the global mean)
            print(f"epoch {epoch + 1}/{args.epochs}  train loss {loss_sum / seen:.4f}  "
                  f"train acc {100 * correct / seen:.2f}%  test loss {test_loss:.4f}  "
                  f"test acc {100 * test_acc:.2f}%  {gseen / ep_train_time:.0f} samples/s  "
                  f"{time.perf_counter() - t_ep:.1f}s  lr {lr:.4g}", flush=True)
        last_end = time.perf_counter()  # evaluation and printing are not training time
        if stop:
            break
    time_s = time.perf_counter() - t_run
    if rank == 0:
        sps = tp_samples / tp_time if tp_time > 0 else float("nan")
        print(f"RESULT model={args.model} world={world} threads={args.threads} samples_per_s={sps:.1f} "
              f"per_rank_samples_per_s={sps / world:.1f} test_acc={test_acc:.4f} epochs={epochs_done} "
              f"steps={step} time_s={time_s:.2f}", flush=True)
    if use_pg:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.rank < 0:
        return launch(args, argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
