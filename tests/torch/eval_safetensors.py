#!/usr/bin/python3
"""Evaluate a `dptrain ckpt export --safetensors` file with PyTorch (1.13) on the
Fashion-MNIST test set, using only what the file says (its __metadata__).
    python3 eval_safetensors.py FILE [DATA_DIR] [N]   (N: the first N test images)"""
import gzip, json, struct, sys
import numpy as np, torch, torch.nn as nn

def load(path):  # safetensors: u64 LE header length, JSON header, raw little-endian data
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__")
    sd = {k: torch.from_numpy(np.frombuffer(blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                                            "<f4").reshape(v["shape"]).copy()) for k, v in header.items()}
    return meta, sd

class MLP(nn.Module):  # flatten, fc1, relu, ..., fcN
    def __init__(self, sd):
        super().__init__()
        self.n = sum(k.startswith("fc") and k.endswith(".weight") for k in sd)
        for i in range(1, self.n + 1):
            setattr(self, f"fc{i}", nn.Linear(*reversed(sd[f"fc{i}.weight"].shape)))
    def forward(self, x):
        x = x.flatten(1)
        for i in range(1, self.n + 1):
            x = getattr(self, f"fc{i}")(x)
            x = torch.relu(x) if i < self.n else x
        return x

class CNN(nn.Module):  # conv3x3-relu-maxpool2 twice, fc1-relu, fc2 (cnn:C1,C2,F: widths from the shapes)
    def __init__(self, sd):
        super().__init__()
        (c1, c0), (c2, _), (f, fin) = [sd[k].shape[:2] for k in ("conv1.weight", "conv2.weight", "fc1.weight")]
        self.conv1, self.conv2 = nn.Conv2d(c0, c1, 3, 1, 1), nn.Conv2d(c1, c2, 3, 1, 1)
        self.fc1, self.fc2 = nn.Linear(fin, f), nn.Linear(f, sd["fc2.weight"].shape[0])
    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))

class Block(nn.Module):  # torchvision's BasicBlock
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)
    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))

class ResNet(nn.Module):  # conv-bn-relu, three stages of n blocks (w, 2w, 4w channels), average pool, fc
    def __init__(self, sd):  # (resnet:DEPTH,WIDTH: n and w from the names and shapes)
        super().__init__()
        w, c0 = sd["conv1.weight"].shape[:2]
        n = len({k.split(".")[1] for k in sd if k.startswith("layer1.")})
        self.conv1, self.bn1 = nn.Conv2d(c0, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w)
        for s in range(3):
            cin = w if s == 0 else w << (s - 1)
            setattr(self, f"layer{s + 1}", nn.Sequential(*[Block(cin if b == 0 else w << s, w << s,
                                                                 2 if s > 0 and b == 0 else 1) for b in range(n)]))
        self.fc = nn.Linear(4 * w, sd["fc.weight"].shape[0])
    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(torch.relu(self.bn1(self.conv1(x))))))
        return self.fc(x.mean((2, 3)))

def main(path, data="/usr/share/datasets/fashion-mnist", limit=None):
    meta, sd = load(path)
    net = {"mlp": MLP, "cnn": CNN, "resnet": ResNet}[meta["dptrain_model"].split(":")[0]](sd)
    net.load_state_dict(sd)  # strict: every name and shape must match (BN's step counter is cast)
    C, H, W = map(int, meta["input_shape"].split(","))
    img = np.frombuffer(gzip.open(f"{data}/t10k-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
    y = torch.from_numpy(np.frombuffer(gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz").read(), np.uint8,
                                       offset=8).astype(np.int64))[:limit]
    x = torch.from_numpy(img.reshape(-1, C, H, W)[:limit].astype(np.float32)) / 255  # as input_preprocessing says
    x = (x - float(meta["input_mean"])) / float(meta["input_std"])
    net.eval()
    with torch.no_grad():
        acc = (net(x).argmax(1) == y).double().mean().item()
    print(f"test acc {100 * acc:.2f}%  ({len(y)} samples)")

if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *[int(a) for a in sys.argv[3:4]])
