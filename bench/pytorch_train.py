#!/usr/bin/python3
"""PyTorch 1.13 peer of `dptrain train`: the same models, data, recipe and flags.

Run it with /usr/bin/python3 (Debian's python3-torch and python3-numpy); the
`python3` first on PATH may be a pyenv interpreter without torch.

    /usr/bin/python3 bench/pytorch_train.py --model cnn --epochs 5 --threads 2
    /usr/bin/python3 bench/pytorch_train.py --model mlp --threads 1 --max-steps 300

Models (PyTorch default initialisation for mlp and cnn; torchvision's ResNet
initialisation for resnet):
  mlp     Flatten, Linear 784-512, ReLU, 512-512, ReLU, 512-10
  cnn     conv 1->32 3x3 p1, ReLU, maxpool 2, conv 32->64 3x3 p1, ReLU, maxpool 2,
          flatten 3136, fc 128, ReLU, fc 10
  resnet  conv1 3x3 1->32 (no bias), bn1, relu, torchvision BasicBlocks
          layer1.0 (32, stride 1), layer2.0 (64, stride 2, 1x1 conv+BN downsample),
          layer3.0 (128, stride 2, downsample), global avgpool, fc 10
          (module names are torchvision's, so state_dict keys match dptrain's
          safetensors export)

Data: Fashion-MNIST IDX files (plain or .gz) read with gzip+numpy, normalised
with mean 0.2860, std 0.3530, reshuffled every epoch, the last batch smaller
(no drop_last).  Augmentation (--crop-pad, --hflip) works like dptrain's:
pad the *normalised* image with zeros, cut a random 28x28 window, mirror with
probability 1/2.

Throughput: samples/s over the training steps only -- the first 5 steps of the
run (warm-up) and all evaluation are excluded; data preparation of each step is
included.  At the end one machine-readable line is printed:

    RESULT model=cnn threads=1 samples_per_s=1234.5 test_acc=0.9123 epochs=5 time_s=...
"""
import argparse
import gzip
import math
import os
import sys
import time
import warnings


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="directory with train-*/t10k-* IDX files, plain or .gz")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "resnet"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    p.add_argument("--warmup", type=int, default=0, help="cosine: linear warmup steps")
    p.add_argument("--min-lr", type=float, default=0.0, help="cosine: final learning rate")
    p.add_argument("--crop-pad", type=int, default=0)
    p.add_argument("--hflip", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps in total (0: off)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training samples")
    p.add_argument("--test-limit", type=int, default=0, help="evaluate on the first N test samples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every-epoch", action="store_true",
                   help="evaluate on the test set after every epoch (not only at the end)")
    p.add_argument("--eval-batch", type=int, default=0, help="evaluation batch size [--batch, as dptrain]")
    p.add_argument("--no-eval", action="store_true", help="skip the final evaluation (speed runs)")
    return p.parse_args(argv)


ARGS = parse_args()

# Pin every thread pool before torch is imported: torch.set_num_threads alone
# does not stop Debian's OpenBLAS from using all cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MEAN, STD = 0.2860, 0.3530


# ---- data ---------------------------------------------------------------------------

def read_idx(path):
    """Reads an IDX file (plain or gzip) into a numpy array."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file")
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if raw[2] not in dtypes:
        raise ValueError(f"{path}: unknown IDX type 0x{raw[2]:02x}")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=dtypes[raw[2]], offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} values, header says {dims}")
    return data.reshape(dims)


def load_split(data_dir, prefix, limit):
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    # One float allocation, normalised in place (fresh memory is slow on these VMs).
    with warnings.catch_warnings():  # the IDX buffer is read-only; .float() copies it
        warnings.simplefilter("ignore", UserWarning)
        x = torch.from_numpy(x).float().unsqueeze(1)  # N,1,28,28
    x.div_(255.0).sub_(MEAN).div_(STD)
    return x, torch.from_numpy(y.astype(np.int64))


def augment(x, crop_pad, hflip, gen):
    """Random crop with zero padding (of the normalised image) and random flip."""
    n, c, h, w = x.shape
    if crop_pad > 0:
        p = crop_pad
        xp = F.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (n,), generator=gen)
        dx = torch.randint(0, 2 * p + 1, (n,), generator=gen)
        rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None].expand(n, c, h, w + 2 * p)
        xp = torch.gather(xp, 2, rows)
        cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :].expand(n, c, h, w)
        x = torch.gather(xp, 3, cols)
    if hflip:
        flip = torch.rand(n, generator=gen) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


# ---- models -------------------------------------------------------------------------

def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock (torchvision is not installed here)."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = conv3x3(1, 32)
        self.bn1 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(32, 32, 1))
        self.layer2 = nn.Sequential(BasicBlock(32, 64, 2))
        self.layer3 = nn.Sequential(BasicBlock(64, 128, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)
        for m in self.modules():  # torchvision's ResNet initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "resnet":
        return ResNet()
    raise ValueError(name)


# ---- schedule, evaluation -----------------------------------------------------------

def lr_at(args, t, total):
    """dptrain's schedule (src/optim/sched.c), per step t = 0, 1, ..."""
    if args.schedule == "cosine":
        warm = args.warmup
        if t < warm:
            return args.lr * (t + 1) / warm
        if t >= total:
            return args.min_lr
        prog = (t - warm) / (total - warm)
        return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1.0 + math.cos(math.pi * prog))
    return args.lr


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    model.eval()
    correct, loss_sum = 0, 0.0
    for i in range(0, x.shape[0], batch):
        out = model(x[i:i + batch])
        loss_sum += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
        correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    n = x.shape[0]
    return correct / n, loss_sum / n


# ---- main ---------------------------------------------------------------------------

def main(args):
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    t_load = time.perf_counter()
    xtr, ytr = load_split(args.data, "train", args.train_limit)
    xte, yte = load_split(args.data, "t10k", args.test_limit)
    t_load = time.perf_counter() - t_load

    model = build_model(args.model)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                          weight_decay=args.weight_decay)
    n = xtr.shape[0]
    steps_per_epoch = (n + args.batch - 1) // args.batch
    total_steps = steps_per_epoch * args.epochs
    print(f"pytorch {torch.__version__}: model {args.model} ({nparams} parameters), batch {args.batch}, "
          f"sgd lr {args.lr} momentum {args.momentum}{' nesterov' if args.nesterov else ''} "
          f"wd {args.weight_decay} schedule {args.schedule}, {args.threads} thread(s) "
          f"(torch {torch.get_num_threads()}), {n} train / {xte.shape[0]} test samples "
          f"(loaded in {t_load:.1f}s)", flush=True)

    model.train()
    step = 0                # steps done in this run
    # Throughput as dptrain measures it: wall time from the end of step 5 to the
    # end of the last step, less evaluation; includes batch preparation.
    tp_time, tp_samples = 0.0, 0
    t_run = time.perf_counter()
    last_end = t_run
    test_acc, test_loss = float("nan"), float("nan")
    epochs_done = 0
    stop = False
    for epoch in range(args.epochs):
        t_ep = time.perf_counter()
        ep_train_time = 0.0
        perm = torch.randperm(n, generator=gen)
        loss_sum, correct, seen = 0.0, 0, 0
        for i in range(0, n, args.batch):
            t0 = time.perf_counter()
            idx = perm[i:i + args.batch]
            xb, yb = xtr.index_select(0, idx), ytr.index_select(0, idx)
            if args.crop_pad or args.hflip:
                xb = augment(xb, args.crop_pad, args.hflip, gen)
            lr = lr_at(args, step, total_steps)
            for g in opt.param_groups:
                g["lr"] = lr
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                loss_sum += loss.item() * xb.shape[0]
                correct += (out.argmax(1) == yb).sum().item()
                seen += xb.shape[0]
            t1 = time.perf_counter()
            step += 1
            ep_train_time += t1 - t0
            if step > 5:
                tp_time += t1 - last_end
                tp_samples += xb.shape[0]
            last_end = t1
            if not math.isfinite(loss_sum):
                print(f"error: loss is not finite at step {step}", file=sys.stderr)
                return 1
            if args.max_steps and step >= args.max_steps:
                stop = True
                break
        if seen == 0:
            break
        epochs_done += 1
        last = epoch == args.epochs - 1 or stop
        if args.eval_every_epoch or (last and not args.no_eval):
            test_acc, test_loss = evaluate(model, xte, yte, args.eval_batch or args.batch)
        print(f"epoch {epoch + 1}/{args.epochs}  train loss {loss_sum / seen:.4f}  "
              f"train acc {100 * correct / seen:.2f}%  test loss {test_loss:.4f}  test acc {100 * test_acc:.2f}%  "
              f"{seen / ep_train_time:.0f} samples/s  {time.perf_counter() - t_ep:.1f}s  lr {lr:.4g}", flush=True)
        last_end = time.perf_counter()  # evaluation and printing are not training time
        if stop:
            break
    time_s = time.perf_counter() - t_run
    sps = tp_samples / tp_time if tp_time > 0 else float("nan")
    print(f"RESULT model={args.model} threads={args.threads} samples_per_s={sps:.1f} test_acc={test_acc:.4f} "
          f"epochs={epochs_done} steps={step} time_s={time_s:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
