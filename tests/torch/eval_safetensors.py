#!/usr/bin/python3
"""Evaluate a `dptrain ckpt export --safetensors` file with PyTorch (1.13) on the
Fashion-MNIST test set, or on your own X.npy and y.npy, using only what the file says
(its __metadata__).
    python3 eval_safetensors.py FILE [DATA_DIR] [N]   (N: the first N test images)
    python3 eval_safetensors.py FILE X.npy y.npy [N]"""
import gzip, json, struct, sys
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F

def load(path):  # safetensors: u64 LE header length, JSON header, raw little-endian data
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__")
    sd = {k: torch.from_numpy(np.frombuffer(blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                                            "<f4").reshape(v["shape"]).copy()) for k, v in header.items()}
    return meta, sd

class Block(nn.Module):  # resblock: torchvision's BasicBlock
    def __init__(self, cin, cout, stride, eps):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout, eps)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout, eps)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout, eps))
                           if stride != 1 or cin != cout else None)
    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))

class FromText(nn.Module):
    """The model's canonical text (metadata dptrain_model_text, docs/models.md), one statement
    per `;`: KIND NAME KEY=VALUE..., run in order; input sizes come from the tensors' shapes."""
    def __init__(self, text, sd):
        super().__init__()
        self.steps = []
        for st in text.split(";"):
            kind, *rest = st.split()
            if kind in ("input", "loss"):
                continue
            name, a = rest[0], {k: v for k, v in (w.split("=") for w in rest[1:])}
            w = sd.get(name + ".weight")
            if kind == "linear":
                mod = nn.Linear(w.shape[1], w.shape[0], bias=a["bias"] == "1")
            elif kind == "conv2d":
                mod = nn.Conv2d(w.shape[1], w.shape[0], int(a["kernel"]), int(a["stride"]), int(a["pad"]),
                                bias=a["bias"] == "1")
            elif kind == "batchnorm":
                mod = nn.BatchNorm2d(w.shape[0], float(a["eps"]), float(a["momentum"]))
            elif kind == "resblock":
                c1 = sd[name + ".conv1.weight"]
                mod = Block(c1.shape[1], c1.shape[0], int(a["stride"]), 1e-5)
            else:
                fn = {"relu": torch.relu, "flatten": lambda x: x.flatten(1), "dropout": lambda x: x,  # (eval)
                      "gelu": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": F.gelu,
                      "global_avgpool": lambda x: x.mean((2, 3)),
                      "maxpool": lambda x, k=int(a.get("kernel", 1)), s=int(a.get("stride", 1)): F.max_pool2d(x, k, s)}
                if kind not in fn:
                    raise ValueError(f"{kind}: this loader rebuilds image models (no {kind})")
                self.steps.append(fn[kind])
                continue
            parent = self  # torch's names: "layer1.0" is module 0 of module layer1
            *path, leaf = name.split(".")
            for p in path:
                if not hasattr(parent, p):
                    parent.add_module(p, nn.Module())
                parent = getattr(parent, p)
            parent.add_module(leaf, mod)
            self.steps.append(mod)
    def forward(self, x):
        for f in self.steps:
            x = f(x)
        return x

def main(path, data="/usr/share/datasets/fashion-mnist", limit=None, labels=None):
    meta, sd = load(path)
    if "dptrain_model_text" not in meta:
        sys.exit(f"{path}: no dptrain_model_text in its metadata (an export of an older dptrain: export it again)")
    net = FromText(meta["dptrain_model_text"], sd)
    net.load_state_dict(sd)  # strict: every name and shape must match (BN's step counter is cast)
    C, H, W = map(int, meta["input_shape"].split(","))
    if labels:  # your own data: X.npy (N, D) or (N, C, H, W), each element as float; y.npy
        x = torch.from_numpy(np.load(data).reshape(-1, C, H, W)[:limit].astype(np.float32))
        y = torch.from_numpy(np.load(labels)[:limit])
    else:  # Fashion-MNIST's IDX files: pixel / 255
        img = np.frombuffer(gzip.open(f"{data}/t10k-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
        y = torch.from_numpy(np.frombuffer(gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz").read(), np.uint8,
                                           offset=8).astype(np.int64))[:limit]
        x = torch.from_numpy(img.reshape(-1, C, H, W)[:limit].astype(np.float32)) / 255
    # as input_preprocessing says: one mean and std per channel (per feature of a table), or one for all
    mean = torch.tensor([float(v) for v in meta["input_mean"].split(",")])
    std = torch.tensor([float(v) for v in meta["input_std"].split(",")])
    x = ((x.reshape(len(x), len(mean), -1) - mean[:, None]) / std[:, None]).reshape(-1, C, H, W)
    net.eval()
    with torch.no_grad():
        out = net(x)
    if meta["dptrain_model_text"].endswith("loss mse"):  # a regression: K outputs
        err = out.double() - y.double().reshape(out.shape)
        print(f"test rmse {err.pow(2).mean().sqrt().item():.4g}  test mae {err.abs().mean().item():.4g}  "
              f"({len(y)} samples)")
    else:
        acc = (out.argmax(1) == y).double().mean().item()
        print(f"test acc {100 * acc:.2f}%  ({len(y)} samples)")

if __name__ == "__main__":
    a = sys.argv[1:]  # WEIGHTS [IDX-FOLDER [LIMIT]]  or  WEIGHTS X.npy y.npy [LIMIT]
    if len(a) >= 3 and a[1].endswith(".npy"):
        main(a[0], a[1], int(a[3]) if len(a) > 3 else None, labels=a[2])
    else:
        main(a[0], *a[1:2], *[int(v) for v in a[2:3]])
