#!/usr/bin/python3
"""Evaluate a `dptrain ckpt export --safetensors` file with PyTorch (1.13) on the
Fashion-MNIST test set, or on your own X.npy and y.npy, or a language model on a token
file's validation windows, using only what the file says (its __metadata__).
    python3 eval_safetensors.py FILE [DATA_DIR] [N]   (N: the first N test images)
    python3 eval_safetensors.py FILE X.npy y.npy [N]
    python3 eval_safetensors.py FILE TOKENS.bin [N]   (a gpt or a token model file's model)"""
import gzip, json, math, struct, sys
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

class Attention(nn.Module):  # causal self-attention: qkv gives [q | k | v], heads contiguous
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(D, -1))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.heads)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return self.proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, D))

class TBlock(Attention):  # transformer_block: pre-LayerNorm, attention then a 4x exact-GELU MLP
    def __init__(self, d, heads):
        super().__init__(d, heads)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        x = x + super().forward(self.ln1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))

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
            elif kind == "layernorm":
                mod = nn.LayerNorm(w.shape[0], float(a["eps"]))
            elif kind in ("attention", "transformer_block"):
                d = sd[name + ".qkv.weight"].shape[1]
                mod = (Attention if kind == "attention" else TBlock)(d, int(a["heads"]))
            elif kind == "embedding":  # two modules under their own names, then their sum
                tok, pos = nn.Embedding(*w.shape), nn.Embedding(*sd[a["pos"] + ".weight"].shape)
                self.put(name, tok), self.put(a["pos"], pos)
                self.steps.append(lambda i, tok=tok, pos=pos: tok(i) + pos(torch.arange(i.shape[1])))
                continue
            elif kind == "lm_head":  # logits against an earlier weight (tied): no module of its own
                self.steps.append(lambda x, t=a["tied"]: x @ self.get_parameter(t).T)
                continue
            else:
                fn = {"relu": torch.relu, "flatten": lambda x: x.flatten(1), "dropout": lambda x: x,  # (eval)
                      "gelu": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": F.gelu,
                      "global_avgpool": lambda x: x.mean((2, 3)),
                      "maxpool": lambda x, k=int(a.get("kernel", 1)), s=int(a.get("stride", 1)): F.max_pool2d(x, k, s)}
                if kind not in fn:
                    raise ValueError(f"{kind}: a statement this loader does not rebuild")
                self.steps.append(fn[kind])
                continue
            self.put(name, mod)
            self.steps.append(mod)
    def put(self, name, mod):
        parent = self  # torch's names: "layer1.0" is module 0 of module layer1
        *path, leaf = name.split(".")
        for p in path:
            if not hasattr(parent, p):
                parent.add_module(p, nn.Module())
            parent = getattr(parent, p)
        parent.add_module(leaf, mod)
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
    net.eval()
    if meta["dptrain_model_text"].startswith("input tokens"):
        return eval_tokens(net, int(meta["input_shape"]), data, limit)
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
    with torch.no_grad():
        out = net(x)
    if meta["dptrain_model_text"].endswith("loss mse"):  # a regression: K outputs
        err = out.double() - y.double().reshape(out.shape)
        print(f"test rmse {err.pow(2).mean().sqrt().item():.4g}  test mae {err.abs().mean().item():.4g}  "
              f"({len(y)} samples)")
    else:
        acc = (out.argmax(1) == y).double().mean().item()
        print(f"test acc {100 * acc:.2f}%  ({len(y)} samples)")

def eval_tokens(net, ctx, path, limit):
    """dptrain's validation of a token file (docs/text.md: DPTOKENS v1, 32-byte header, uint16
    tokens): its last floor(n / 20) tokens; window k's inputs are those tokens [k ctx, (k+1) ctx),
    its targets the same shifted by one; the loss is the mean cross-entropy per token."""
    blob = open(path, "rb").read()
    if blob[:8] != b"DPTOKENS":
        sys.exit(f"{path}: not a dptrain token file (dptrain prepare-text writes one)")
    tok = torch.from_numpy(np.frombuffer(blob, "<u2", offset=32).astype(np.int64))
    first = len(tok) - len(tok) // 20
    n = (len(tok) - first - 1) // ctx if limit is None else min(limit, (len(tok) - first - 1) // ctx)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for k in range(0, n, 16):
            idx = first + torch.arange(k, min(k + 16, n))[:, None] * ctx + torch.arange(ctx + 1)[None, :]
            w = tok[idx]
            out = net(w[:, :-1])
            loss += F.cross_entropy(out.reshape(-1, out.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
            correct += (out.argmax(-1) == w[:, 1:]).sum().item()
    print(f"val loss {loss / (n * ctx):.4f}  token acc {100 * correct / (n * ctx):.2f}%  ({n} windows)")

if __name__ == "__main__":
    a = sys.argv[1:]  # WEIGHTS [IDX-FOLDER [LIMIT]]  or  WEIGHTS X.npy y.npy [LIMIT]  or  WEIGHTS TOKENS [LIMIT]
    if len(a) >= 3 and a[1].endswith(".npy"):
        main(a[0], a[1], int(a[3]) if len(a) > 3 else None, labels=a[2])
    else:
        main(a[0], *a[1:2], *[int(v) for v in a[2:3]])
