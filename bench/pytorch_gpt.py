#!/usr/bin/python3
"""PyTorch 1.13 peer of `dptrain train --model gpt:...`: the same GPT, token file and recipe.

Run it with /usr/bin/python3 (Debian's python3-torch and python3-numpy); the
`python3` first on PATH may be a pyenv interpreter without torch.

    /usr/bin/python3 bench/pytorch_gpt.py --data tokens.bin --threads 1 --max-steps 200 --no-eval
    /usr/bin/python3 bench/pytorch_gpt.py --data tokens.bin --world 2 --max-steps 200 --no-eval
    /usr/bin/python3 bench/pytorch_gpt.py --data tokens.bin --epochs 1 --train-limit 64000 \\
        --schedule cosine --warmup 100          # 2000 steps, then the validation loss

Model: the reference module of issue 10 F4, imported from tests/torch/ref.py
(the one the correctness tests compare dptrain with, so the two cannot drift
apart): tok, pos Embeddings; pre-LN blocks ln1, qkv (D->3D), causal attention,
proj, ln2, fc (D->4D), exact (erf) GELU, fc_out; ln_f; logits = ln_f(x) @
tok.weight.T (tied, no bias).  Initialisation as dptrain's: N(0, 0.02) for
Linear and Embedding weights, zero biases, after torch.manual_seed(--seed).

Data: a DPTOKENS v1 file (`dptrain prepare-text`; docs/text.md), every header
field checked as dptrain checks it (magic, version, vocab, count against the
file size, reserved, CRC-32, each token below vocab).  The split is dptrain's:
the last floor(n x 0.05) tokens validate, the rest train.
  * Training windows: ctx + 1 consecutive training tokens (inputs the first
    ctx, targets the last ctx), the start uniform over the train_n - ctx
    possible starts, drawn with replacement, as dptrain draws them (dptrain
    uses Philox at (seed, epoch, index); here torch.randint from a seeded
    generator: the same distribution, not the same windows).
  * An epoch is floor(train_n / (ctx + 1)) windows (--train-limit N caps it),
    cut into global batches of --batch windows, the last one smaller.
  * Validation windows: dptrain's, exactly: window k's inputs are validation
    tokens [k ctx, (k+1) ctx), its targets the same range shifted by one;
    (val_n - 1) // ctx of them (--test-limit N keeps the first N).  The loss
    is the cross-entropy summed over every position of every window, divided
    by windows x ctx: the mean per token, as dptrain's val loss.

Optimizer: torch.optim.AdamW with dptrain's defaults (betas 0.9/0.999, eps
1e-8, weight decay 0: src/optim/optim.c; note that PyTorch's own default
weight decay is 0.01), one parameter group; lr --lr.  --schedule cosine
--warmup W --min-lr F follows src/optim/sched.c per step (imported from
bench/pytorch_train.py): lr = base (t+1)/W during warmup, then cosine decay to
min-lr over epochs x steps per epoch.

--world W (W > 1) trains with DistributedDataParallel over gloo, W processes
of --threads threads each, launched by this script (as bench/pytorch_ddp.py
does: tcp://127.0.0.1:<free port>, GLOO_SOCKET_IFNAME=lo, DDP's default
bucket_cap_mb 25).  --batch is global: every rank draws the same global batch
of windows from the shared seed and takes its contiguous share
(torch.tensor_split), as dptrain's workers do; the loss is the sum over the
share's positions scaled by W / (global batch x ctx), so DDP's average over
the ranks is the mean over every position of the global batch.

Throughput is measured (on rank 0) as dptrain's `throughput:` line measures
it: windows (and tokens = windows x ctx) over the wall time from the end of
step 5 to the end of the last step, evaluation excluded, batch preparation
included.  At the end (rank 0) prints:

    RESULT model=gpt:... world=1 threads=1 tokens_per_s=27000.1 samples_per_s=421.9 val_loss=nan
           steps=200 time_s=...

Evaluation runs after the last epoch (or after --max-steps stops the run)
unless --no-eval; --eval-every-epoch evaluates after every epoch, as dptrain
does.  --export-init FILE writes the initial weights (safetensors, the names
dptrain's --init-from reads) before training; with --epochs 0 --no-eval it
only writes them.  --init-from FILE starts from such a file instead.
"""
import argparse
import math
import os
import socket
import struct
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REF_DIR = os.path.join(HERE, "..", "tests", "torch")
VAL_FRAC = 0.05  # DP_TEXT_VAL_FRAC


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="token file (dptrain prepare-text --out FILE)")
    p.add_argument("--model", default="gpt:layers=4,heads=4,dim=128,ctx=64",
                   help="gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V] [%(default)s]")
    p.add_argument("--world", type=int, default=1, help="processes; > 1: DDP over gloo [1]")
    p.add_argument("--threads", type=int, default=1, help="compute threads per process [1]")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="global batch of windows [32]")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0, help="[0, dptrain's default]")
    p.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    p.add_argument("--warmup", type=int, default=0, help="cosine: linear warmup steps")
    p.add_argument("--min-lr", type=float, default=0.0, help="cosine: final learning rate")
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps in total (0: off)")
    p.add_argument("--train-limit", type=int, default=0, help="windows per epoch [training tokens / (ctx + 1)]")
    p.add_argument("--test-limit", type=int, default=0, help="evaluate the first N validation windows [all]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every-epoch", action="store_true", help="evaluate after every epoch")
    p.add_argument("--eval-batch", type=int, default=16, help="validation windows per forward [16, dptrain's chunk]")
    p.add_argument("--no-eval", action="store_true", help="skip the final evaluation (speed runs)")
    p.add_argument("--export-init", default=None, help="write the initial weights (safetensors) to FILE")
    p.add_argument("--init-from", default=None, help="initial weights from a safetensors file")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb [25, the default]")
    p.add_argument("--port", type=int, default=0, help="TCP port of the rendezvous [a free one]")
    p.add_argument("--timeout", type=float, default=1800, help="collective timeout in seconds [1800]")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the launcher
    return p.parse_args(argv)


# ---- launcher (no torch here), as bench/pytorch_ddp.py's ---------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    port = args.port or free_port()
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv +
                              ["--rank", str(r), "--port", str(port)], env=env) for r in range(args.world)]
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
                    for other in pending:  # the others would wait for it until the timeout
                        other.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for pr in procs:
            pr.terminate()
        rc = 130
    for pr in procs:
        pr.wait()
    return rc if rc >= 0 else 1


# ---- token file (src/data/text.c, docs/text.md) --------------------------------------------

def read_tokens(path):
    """DPTOKENS v1: magic, u32 version 1, u32 vocab 2..65536, u64 count >= 1, u32 CRC-32 of
    the token bytes, u32 reserved 0, then count uint16 tokens, all little-endian.
    Returns (vocab, numpy uint16 array)."""
    import numpy as np
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 32 or blob[:8] != b"DPTOKENS":
        raise ValueError(f"{path}: not a token file (magic)")
    version, vocab, count, crc, reserved = struct.unpack_from("<IIQII", blob, 8)
    if version != 1:
        raise ValueError(f"{path}: version {version}, expected 1")
    if not 2 <= vocab <= 65536:
        raise ValueError(f"{path}: vocab {vocab} not in 2..65536")
    if count < 1 or 32 + 2 * count != len(blob):
        raise ValueError(f"{path}: count {count} does not match the file size {len(blob)}")
    if reserved != 0:
        raise ValueError(f"{path}: reserved field {reserved}, expected 0")
    if zlib.crc32(blob[32:]) & 0xFFFFFFFF != crc:
        raise ValueError(f"{path}: CRC-32 mismatch")
    tok = np.frombuffer(blob, dtype="<u2", offset=32)
    if int(tok.max()) >= vocab:
        raise ValueError(f"{path}: a token is not below vocab {vocab}")
    return vocab, tok


def split(n):
    """(train_n, val_n): the last floor(n x 0.05) tokens validate (dp_text_split_init)."""
    val_n = int(math.floor(n * VAL_FRAC))
    return n - val_n, val_n


# ---- worker --------------------------------------------------------------------------------

def worker(args):
    # Pin every thread pool before torch is imported: torch.set_num_threads alone
    # does not stop Debian's OpenBLAS from using all cores.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import datetime
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, REF_DIR)
    import ref  # tests/torch/ref.py: the reference module, safetensors I/O
    # The schedule of bench/pytorch_train.py (src/optim/sched.c); that module
    # parses sys.argv when imported, so hand it a command line of its own.
    sys.path.insert(0, HERE)
    saved_argv = sys.argv
    sys.argv = [os.path.join(HERE, "pytorch_train.py"), "--threads", str(args.threads)]
    try:
        import pytorch_train as pt
    finally:
        sys.argv = saved_argv

    rank, world = max(args.rank, 0), args.world
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    use_pg = world > 1
    if use_pg:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=args.timeout))

    t_load = time.perf_counter()
    vocab, tok_np = read_tokens(args.data)
    cfg = ref.parse_gpt(args.model)
    ctx = cfg["ctx"]
    if vocab > cfg["vocab"]:
        raise ValueError(f"{args.data} has a vocabulary of {vocab} tokens, model {args.model} outputs {cfg['vocab']}")
    tok = torch.from_numpy(tok_np.astype(np.int64))
    n = tok.shape[0]
    train_n, val_n = split(n)
    if train_n < ctx + 1:
        raise ValueError(f"{args.data}: the training part holds {train_n} tokens, a window needs {ctx + 1}")
    t_load = time.perf_counter() - t_load

    torch.manual_seed(args.seed)                    # the same initial weights on every rank
    net = ref.GPT(cfg["layers"], cfg["heads"], cfg["dim"], ctx, cfg["vocab"])
    net.init_weights()
    if args.init_from:
        ref.load_weights(net, ref.st_read(args.init_from), args.init_from)
    if args.export_init and rank == 0:
        ref.st_write(args.export_init, {k: ref.f32(v) for k, v in net.state_dict().items()},
                     {"format": "pt", "source": "bench/pytorch_gpt.py --export-init", "model": args.model})
    nparams = sum(p.numel() for p in net.parameters())
    model = DDP(net, bucket_cap_mb=args.bucket_cap_mb) if use_pg else net
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)  # the same windows on every rank
    windows = train_n // (ctx + 1)
    if args.train_limit > 0:
        windows = min(windows, args.train_limit)
    steps_per_epoch = (windows + args.batch - 1) // args.batch
    total_steps = steps_per_epoch * args.epochs
    if args.schedule == "cosine" and args.epochs > 0 and args.warmup >= total_steps:
        raise ValueError(f"--warmup {args.warmup} must be shorter than the run ({total_steps} steps)")
    offs = torch.arange(ctx + 1)
    nval = (val_n - 1) // ctx if val_n >= 1 else 0
    if args.test_limit > 0:
        nval = min(nval, args.test_limit)
    if rank == 0:
        print(f"pytorch {torch.__version__}: model {args.model} ({nparams} parameters), global batch "
              f"{args.batch} over {world} process(es){' (DDP, gloo)' if use_pg else ''}, adamw lr {args.lr} "
              f"betas {args.beta1}/{args.beta2} eps {args.eps} wd {args.weight_decay} schedule {args.schedule}, "
              f"{args.threads} thread(s) per process (torch {torch.get_num_threads()}); {n} tokens: "
              f"{train_n} train ({windows} windows per epoch, {steps_per_epoch} steps), {val_n} validation "
              f"({nval} windows) (loaded in {t_load:.1f}s)", flush=True)

    @torch.no_grad()
    def evaluate():
        """dptrain's validation: fixed consecutive windows, mean cross-entropy per token."""
        net.eval()
        loss_sum, correct = 0.0, 0
        for i in range(0, nval, args.eval_batch):
            k = torch.arange(i, min(i + args.eval_batch, nval))
            idx = train_n + k[:, None] * ctx + offs[None, :]
            w = tok[idx]
            out = net(w[:, :-1])
            y = w[:, 1:]
            loss_sum += F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum").item()
            correct += (out.argmax(-1) == y).sum().item()
        net.train()
        terms = nval * ctx
        return (loss_sum / terms, correct / terms) if terms else (float("nan"), float("nan"))

    if use_pg:
        dist.barrier()
    model.train()
    step = 0
    # Throughput as dptrain measures it: wall time from the end of step 5 to the
    # end of the last step, less evaluation; includes batch preparation.
    tp_time, tp_windows = 0.0, 0
    t_run = time.perf_counter()
    last_end = t_run
    val_loss, val_acc = float("nan"), float("nan")
    epochs_done = 0
    stop = False
    lr = args.lr
    for epoch in range(args.epochs):
        t_ep = time.perf_counter()
        ep_train_time = 0.0
        loss_sum, gseen = 0.0, 0
        for i in range(0, windows, args.batch):
            t0 = time.perf_counter()
            g = min(args.batch, windows - i)
            # The global batch's starts, the same on every rank; this rank's share.
            starts = torch.randint(0, train_n - ctx, (g,), generator=gen)
            if g < world:
                continue  # a rank would get no window: skipped on every rank alike
            share = torch.tensor_split(starts, world)[rank]
            w = tok[share[:, None] + offs[None, :]]
            x, y = w[:, :-1], w[:, 1:]
            lr = pt.lr_at(args, step, total_steps)
            for grp in opt.param_groups:
                grp["lr"] = lr
            out = model(x)
            # Sum over the share's positions, scaled so that the mean over the
            # ranks (DDP) is the mean over every position of the global batch.
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum") \
                * (world / (g * ctx))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * g / world  # this rank's part of the global mean, x g
            gseen += g
            t1 = time.perf_counter()
            step += 1
            ep_train_time += t1 - t0
            if step > 5:
                tp_time += t1 - last_end
                tp_windows += g
            last_end = t1
            if not math.isfinite(loss_sum):
                print(f"error: rank {rank}: loss is not finite at step {step}", file=sys.stderr)
                return 1
            if args.max_steps and step >= args.max_steps:
                stop = True
                break
        if gseen == 0:
            break
        if use_pg:  # the global mean: every rank's part (one all-reduce per epoch)
            tot = torch.tensor([loss_sum], dtype=torch.float64)
            dist.all_reduce(tot)
            loss_sum = tot.item()
        epochs_done += 1
        last = epoch == args.epochs - 1 or stop
        if rank == 0:
            if args.eval_every_epoch or (last and not args.no_eval):
                val_loss, val_acc = evaluate()
            print(f"epoch {epoch + 1}/{args.epochs}  train loss {loss_sum / gseen:.4f}  val loss {val_loss:.4f}  "
                  f"val ppl {math.exp(val_loss) if math.isfinite(val_loss) else float('nan'):.2f}  "
                  f"{gseen * ctx / ep_train_time:.0f} tokens/s  {time.perf_counter() - t_ep:.1f}s  lr {lr:.4g}",
                  flush=True)
        last_end = time.perf_counter()  # evaluation and printing are not training time
        if stop:
            break
    time_s = time.perf_counter() - t_run
    if rank == 0:
        sps = tp_windows / tp_time if tp_time > 0 else float("nan")
        print(f"RESULT model={args.model} world={world} threads={args.threads} tokens_per_s={sps * ctx:.1f} "
              f"samples_per_s={sps:.2f} val_loss={val_loss:.6f} val_acc={val_acc:.6f} epochs={epochs_done} "
              f"steps={step} time_s={time_s:.2f}", flush=True)
    if use_pg:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.world < 1 or args.threads < 1 or args.batch < 1 or args.epochs < 0 or args.eval_batch < 1:
        print("pytorch_gpt: error: --world, --threads, --batch and --eval-batch must be >= 1, --epochs >= 0",
              file=sys.stderr)
        return 2
    if args.world > 1 and args.rank < 0:
        return launch(args, argv)
    try:
        return worker(args)
    except (ValueError, OSError) as e:
        print(f"pytorch_gpt: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
