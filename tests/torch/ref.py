#!/usr/bin/python3
"""PyTorch reference for tests/test_torch_ref.c (issue item A10).

Usage:
    /usr/bin/python3 tests/torch/ref.py MODEL IN.safetensors OUT.safetensors \
        [--inputs INPUTS.safetensors] [--export-init INIT.safetensors]

MODEL is mlp, cnn or resnet (the architectures of src/nn/models.c, with the
same module names, so that state_dict names match dptrain's).

IN holds every state_dict tensor of the model as F32, as written by
dp_safetensors_save (num_batches_tracked too: it is converted to int64 here).
The batch is two more tensors, read from IN or, with --inputs, from a separate
file:
    input.x  F32 (B, C, H, W)   the images
    input.y  I32 (B)            the class labels (F32 and I64 are accepted too)

The script loads the weights with load_state_dict(strict=True) (every name
must match; shapes as torch's loader accepts them, which lets a one-element
(1) tensor fill a 0-d one such as num_batches_tracked),
computes eval-mode logits (BN with the running statistics from IN), then
runs one training-mode forward, loss = F.cross_entropy(logits, y) (the mean
over the batch), and backward, and writes OUT (all F32):
    logits_eval             (B, classes) eval-mode logits, weights from IN
    logits                  (B, classes) training-mode logits
    loss                    (1)
    grad.<param name>       for every parameter (same shape as the parameter)
    buffer.<buffer name>    for every buffer after the training forward
                            (BatchNorm running_mean, running_var,
                            num_batches_tracked), BN models only
With --export-init it also writes INIT: the state_dict of a freshly
initialised torch model (torch.manual_seed(0), PyTorch's own default
initialisation) with every tensor as F32 and torch's shapes (so
num_batches_tracked is 0-d, shape []), i.e. a file for dptrain's --init-from; and OUT gets one more tensor:
    logits_init             (B, classes) eval-mode logits of that fresh model
                            on input.x

CPU only, torch.set_num_threads(1), float32 throughout: the result is
deterministic (no nondeterministic kernels are used on the CPU).

safetensors is read and written with the small pure-Python code below (json +
struct + numpy), so the safetensors package is not needed.
"""
import json
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


def build(model, weights, in_shape):
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
    raise ValueError(f"unknown model {model!r} (expected mlp, cnn or resnet)")


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


def main(argv):
    args, inputs_path, init_path = [], None, None
    i = 1
    while i < len(argv):
        if argv[i] == "--inputs" and i + 1 < len(argv):
            inputs_path = argv[i + 1]
            i += 2
        elif argv[i] == "--export-init" and i + 1 < len(argv):
            init_path = argv[i + 1]
            i += 2
        else:
            args.append(argv[i])
            i += 1
    if len(args) != 3:
        sys.stderr.write(__doc__)
        return 2
    model, in_path, out_path = args

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    weights = st_read(in_path)
    batch = st_read(inputs_path) if inputs_path else {}
    for k in ("input.x", "input.y"):
        if k in weights:
            batch[k] = weights.pop(k)
        if k not in batch:
            raise ValueError(f"{k} not found in {in_path}" + (f" or {inputs_path}" if inputs_path else ""))
    x = torch.from_numpy(batch["input.x"].astype(np.float32))
    y = torch.from_numpy(np.rint(batch["input.y"]).astype(np.int64) if batch["input.y"].dtype.kind == "f"
                         else batch["input.y"].astype(np.int64))
    if x.dim() != 4 or y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"input.x must be (B,C,H,W) and input.y (B): got {tuple(x.shape)}, {tuple(y.shape)}")
    in_shape = tuple(x.shape[1:])

    net = build(model, weights, in_shape)
    load_weights(net, weights, in_path)
    with torch.no_grad():  # before the training forward changes the BN buffers
        net.eval()
        logits_eval = net(x)
    net.train()
    net.zero_grad(set_to_none=False)
    logits = net(x)
    loss = F.cross_entropy(logits, y)  # reduction="mean"
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
