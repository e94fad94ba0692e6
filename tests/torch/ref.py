#!/usr/bin/python3
"""PyTorch reference for tests/test_torch_ref.c (issue items A10, 10 F4).

Usage:
    /usr/bin/python3 tests/torch/ref.py MODEL IN.safetensors OUT.safetensors \
        [--inputs INPUTS.safetensors] [--export-init INIT.safetensors]
    /usr/bin/python3 tests/torch/ref.py MODEL --adamw TRAIN.safetensors OUT.safetensors \
        --export-init INIT.safetensors

MODEL is mlp, cnn, resnet or gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V] (the
architectures of src/nn/models.c, with the same module names, so that
state_dict names match dptrain's).  gpt is the reference module of issue 10
F4: tok, pos Embeddings; blocks.i.{ln1, qkv (D->3D), proj, ln2, fc (D->4D),
fc_out}; ln_f; logits = ln_f(x) @ tok.weight.T (tied, no bias); causal
attention with q, k, v the three D-wide thirds of qkv's output, each split
into heads contiguously; exact (erf) GELU; no dropout.

IN holds every state_dict tensor of the model as F32, as written by
dp_safetensors_save (num_batches_tracked too: it is converted to int64 here).
The batch is two more tensors, read from IN or, with --inputs, from a separate
file:
    input.x  F32 (B, C, H, W)   the images
    input.y  I32 (B)            the class labels (F32 and I64 are accepted too)
or, for gpt,
    input.tokens   I32 (B, T)   token ids
    input.targets  I32 (B, T)   the next token at each position

The script loads the weights with load_state_dict(strict=True) (every name
must match; shapes as torch's loader accepts them, which lets a one-element
(1) tensor fill a 0-d one such as num_batches_tracked),
computes eval-mode logits (BN with the running statistics from IN), then
runs one training-mode forward, loss = F.cross_entropy(logits, y) (the mean
over the batch; for gpt over every (sample, position)), and backward, and
writes OUT (all F32):
    logits_eval             (B, classes) eval-mode logits, weights from IN
                            (gpt: (B, T, V), and the same as logits: no dropout)
    logits                  (B, classes) training-mode logits
    loss                    (1)
    grad.<param name>       for every parameter (same shape as the parameter)
    buffer.<buffer name>    for every buffer after the training forward
                            (BatchNorm running_mean, running_var,
                            num_batches_tracked), BN models only
With --export-init it also writes INIT: the state_dict of a freshly
initialised torch model (torch.manual_seed(0), PyTorch's own default
initialisation; for gpt dptrain's: N(0, 0.02) Linear and Embedding
weights, zero biases) with every tensor as F32 and torch's shapes (so
num_batches_tracked is 0-d, shape []), i.e. a file for dptrain's --init-from; and OUT gets one more tensor:
    logits_init             (B, classes) eval-mode logits of that fresh model
                            on input.x

With --adamw (tests/test_torch_ref.c torch_ref_gpt_adamw_curve) nothing is
read from IN: a fresh model (torch.manual_seed(0), as --export-init, and
written to INIT first) takes S steps of torch.optim.AdamW (foreach=False) on
the windows of TRAIN:
    train.tokens   I32 (S, B, T)  step s's input ids
    train.targets  I32 (S, B, T)  step s's next tokens
    train.lr       F32 (S)        step s's learning rate
    train.hparams  F32 (4)        beta1, beta2, eps, weight_decay
each step zero_grad, the mean cross-entropy, backward, step; OUT gets
    losses         F32 (S)        the loss of each step, before its update

CPU only, torch.set_num_threads(1), float32 throughout: the result is
deterministic (no nondeterministic kernels are used on the CPU).

safetensors is read and written with the small pure-Python code below (json +
struct + numpy), so the safetensors package is not needed.
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- safetensors ---------------------------------------------------------------

_DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "U8": "u1", "I8": "i1"}


def st_read(path):
    """Returns {name: numpy array} (copies, native byte order)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        shape = tuple(int(d) for d in info["shape"])
        arr = np.frombuffer(data[b:e], dtype=dt)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        out[name] = arr.reshape(shape).astype(np.dtype(dt).newbyteorder("="), copy=True)
    return out


def st_write(path, tensors, metadata=None):
    """Writes {name: numpy array} (dtypes float32/float64/int32/int64/...)."""
    rev = {np.dtype(v).name: k for k, v in _DTYPES.items()}
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    off = 0
    for name, arr in tensors.items():
        arr = np.array(arr, order="C", copy=True)  # (ascontiguousarray would make 0-d arrays 1-d)
        dtype = rev.get(arr.dtype.name)
        if dtype is None:
            raise ValueError(f"tensor {name}: unsupported numpy dtype {arr.dtype}")
        raw = arr.astype(_DTYPES[dtype], copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # align the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)


# ---- the models (src/nn/models.c) ------------------------------------------------


class MLP(nn.Module):
    """flatten, fc1, relu1, fc2, relu2, ..., fcN (no relu after the last)."""

    def __init__(self, widths):
        super().__init__()
        self.flatten = nn.Flatten()
        self.n = len(widths) - 1
        for i in range(1, len(widths)):
            setattr(self, f"fc{i}", nn.Linear(widths[i - 1], widths[i]))
            if i < self.n:
                setattr(self, f"relu{i}", nn.ReLU())

    def forward(self, x):
        x = self.flatten(x)
        for i in range(1, self.n + 1):
            x = getattr(self, f"fc{i}")(x)
            if i < self.n:
                x = getattr(self, f"relu{i}")(x)
        return x


class CNN(nn.Module):
    def __init__(self, C, H, W, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 32, 3, 1, 1, bias=True)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(32, 64, 3, 1, 1, bias=True)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(64 * (H // 4) * (W // 4), 128)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc2(self.relu3(self.fc1(self.flatten(x))))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: y = relu(bn2(conv2(relu(bn1(conv1(x))))) + s(x))."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                            nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idn = x if self.downsample is None else self.downsample(x)
        return self.relu(out + idn)


class ResNet(nn.Module):
    def __init__(self, C, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 32, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(32, eps=1e-5, momentum=0.1)
        self.relu = nn.ReLU()
        self.layer1 = nn.Sequential(BasicBlock(32, 32, 1))
        self.layer2 = nn.Sequential(BasicBlock(32, 64, 2))
        self.layer3 = nn.Sequential(BasicBlock(64, 128, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Block(nn.Module):
    """Pre-LN GPT block (src/nn/transformer.c, attention.c), no dropout:
    x = x + proj(attn(ln1(x))), x = x + fc_out(gelu(fc(ln2(x)))).
    qkv's output is [q | k | v] (D each), and each of q, k, v is split into
    heads contiguously (head h = columns [h dh, (h+1) dh)), as in attention.c."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        H = self.heads
        dh = D // H
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, H, dh).transpose(1, 2) for t in (q, k, v))  # (B, H, T, dh)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        att = (p @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(att)
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))  # exact (erf) GELU


class GPT(nn.Module):
    """The reference module of issue 10 F4 (src/nn/models.c build_gpt):
    tok, pos Embeddings, blocks.i, ln_f, logits = ln_f(x) @ tok.weight.T."""

    def __init__(self, layers, heads, dim, ctx, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def init_weights(self):
        """dptrain's gpt initialisation: N(0, 0.02) for Linear and Embedding
        weights, zero biases, LayerNorm weight 1 and bias 0."""
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, 0.0, 0.02)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.tok.weight.T


def parse_gpt(model):
    """'gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V]' (any order) -> dict."""
    kv = {}
    for part in model[4:].split(","):
        k, _, v = part.partition("=")
        if k not in ("layers", "heads", "dim", "ctx", "vocab") or k in kv or not v.isdigit():
            raise ValueError(f"bad gpt spec {model!r}")
        kv[k] = int(v)
    kv.setdefault("vocab", 256)
    if len(kv) != 5:
        raise ValueError(f"gpt spec {model!r}: layers, heads, dim and ctx are required")
    return kv


def build(model, weights, in_shape):
    if model.startswith("gpt:"):
        c = parse_gpt(model)
        net = GPT(c["layers"], c["heads"], c["dim"], c["ctx"], c["vocab"])
        net.init_weights()
        return net
    C, H, W = in_shape
    if model == "mlp":
        # The widths come from the weights (mlp = 784,512,512,10 by default).
        n = 0
        while f"fc{n + 1}.weight" in weights:
            n += 1
        if n == 0:
            raise ValueError("mlp: no fc1.weight in the weights")
        widths = [C * H * W] + [weights[f"fc{i}.weight"].shape[0] for i in range(1, n + 1)]
        return MLP(widths)
    if model == "cnn":
        return CNN(C, H, W)
    if model == "resnet":
        return ResNet(C)
    raise ValueError(f"unknown model {model!r} (expected mlp, cnn, resnet or gpt:...)")


def load_weights(net, weights, path):
    """load_state_dict(strict=True): the same names as the torch model's
    state_dict, and shapes as torch's loader accepts them (torch's own rule
    lets a one-element 1-d tensor fill a 0-d one, e.g. num_batches_tracked
    stored with shape (1))."""
    sd = net.state_dict()
    missing = [k for k in sd if k not in weights]
    extra = [k for k in weights if k not in sd]
    if missing or extra:
        raise ValueError(f"{path}: names differ from the torch model: missing {missing}, extra {extra}")
    new = {}
    for k, ref in sd.items():
        t = torch.from_numpy(np.array(weights[k], order="C", copy=True))
        if ref.dtype == torch.int64:  # num_batches_tracked, stored as F32 by dptrain
            t = torch.round(t.double()).to(torch.int64)
        else:
            t = t.to(ref.dtype)
        new[k] = t
    net.load_state_dict(new, strict=True)


def f32(t):
    return t.detach().to(torch.float32).contiguous().numpy().copy()


def read_batch(model, weights, batch, where):
    """The batch as torch tensors (x, y), popping input.* from weights."""
    keys = ("input.tokens", "input.targets") if model.startswith("gpt:") else ("input.x", "input.y")
    for k in keys:
        if k in weights:
            batch[k] = weights.pop(k)
        if k not in batch:
            raise ValueError(f"{k} not found in {where}")
    x, y = batch[keys[0]], batch[keys[1]]
    y = torch.from_numpy(np.rint(y).astype(np.int64) if y.dtype.kind == "f" else y.astype(np.int64))
    if model.startswith("gpt:"):
        x = torch.from_numpy(x.astype(np.int64))
        if x.dim() != 2 or tuple(y.shape) != tuple(x.shape):
            raise ValueError(f"input.tokens and input.targets must both be (B,T): got {tuple(x.shape)}, {tuple(y.shape)}")
        return x, y
    x = torch.from_numpy(x.astype(np.float32))
    if x.dim() != 4 or y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"input.x must be (B,C,H,W) and input.y (B): got {tuple(x.shape)}, {tuple(y.shape)}")
    return x, y


def xent(logits, y):
    """Mean cross-entropy over every row: the batch, or every (sample, position)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train_adamw(model, train_path, out_path, init_path):
    """--adamw: S AdamW steps from a fresh torch model (exported to INIT first)."""
    if init_path is None:
        raise ValueError("--adamw needs --export-init (the initial weights dptrain starts from)")
    tr = st_read(train_path)
    for k in ("train.tokens", "train.targets", "train.lr", "train.hparams"):
        if k not in tr:
            raise ValueError(f"{train_path}: no tensor {k}")
    toks = torch.from_numpy(tr["train.tokens"].astype(np.int64))
    tgts = torch.from_numpy(tr["train.targets"].astype(np.int64))
    lrs = [float(v) for v in tr["train.lr"].astype(np.float32)]
    b1, b2, eps, wd = (float(v) for v in tr["train.hparams"].astype(np.float32))
    if toks.dim() != 3 or tuple(tgts.shape) != tuple(toks.shape) or len(lrs) != toks.shape[0]:
        raise ValueError(f"{train_path}: train.tokens/targets must be (S,B,T) and train.lr (S)")
    torch.manual_seed(0)
    net = build(model, {}, None)
    st_write(init_path, {k: f32(v) for k, v in net.state_dict().items()},
             {"format": "pt", "source": "tests/torch/ref.py --export-init"})
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=lrs[0], betas=(b1, b2), eps=eps, weight_decay=wd,
                            foreach=False)
    losses = []
    for step in range(toks.shape[0]):
        for g in opt.param_groups:
            g["lr"] = lrs[step]
        opt.zero_grad(set_to_none=False)
        loss = xent(net(toks[step]), tgts[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    st_write(out_path, {"losses": np.array(losses, dtype=np.float32)},
             {"format": "pt", "source": "tests/torch/ref.py --adamw", "model": model})
    return 0


def main(argv):
    args, inputs_path, init_path, train_path = [], None, None, None
    i = 1
    while i < len(argv):
        if argv[i] == "--inputs" and i + 1 < len(argv):
            inputs_path = argv[i + 1]
            i += 2
        elif argv[i] == "--export-init" and i + 1 < len(argv):
            init_path = argv[i + 1]
            i += 2
        elif argv[i] == "--adamw" and i + 1 < len(argv):
            train_path = argv[i + 1]
            i += 2
        else:
            args.append(argv[i])
            i += 1
    if len(args) != (2 if train_path else 3):
        sys.stderr.write(__doc__)
        return 2

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    if train_path:
        return train_adamw(args[0], train_path, args[1], init_path)
    model, in_path, out_path = args

    weights = st_read(in_path)
    batch = st_read(inputs_path) if inputs_path else {}
    x, y = read_batch(model, weights, batch, in_path + (f" or {inputs_path}" if inputs_path else ""))
    in_shape = tuple(x.shape[1:])

    net = build(model, weights, in_shape)
    load_weights(net, weights, in_path)
    with torch.no_grad():  # before the training forward changes the BN buffers
        net.eval()
        logits_eval = net(x)
    net.train()
    net.zero_grad(set_to_none=False)
    logits = net(x)
    loss = xent(logits, y)  # reduction="mean"
    loss.backward()

    out = {"logits": f32(logits), "loss": f32(loss.reshape(1)), "logits_eval": f32(logits_eval)}
    for name, p in net.named_parameters():
        out["grad." + name] = f32(p.grad)
    for name, b in net.named_buffers():
        out["buffer." + name] = f32(b)

    if init_path:
        torch.manual_seed(0)
        fresh = build(model, weights, in_shape)
        st_write(init_path, {k: f32(v) for k, v in fresh.state_dict().items()},
                 {"format": "pt", "source": "tests/torch/ref.py --export-init"})
        fresh.eval()
        with torch.no_grad():
            out["logits_init"] = f32(fresh(x))

    st_write(out_path, out, {"format": "pt", "source": "tests/torch/ref.py", "model": model})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        sys.stderr.write(f"ref.py: error: {e}\n")
        sys.exit(1)
