"""A PyTorch model trained by dptrain, and back (docs/python.md "From PyTorch").

    PYTHONPATH=python python3 examples/python/from_torch.py
"""
import gzip

import numpy as np
import torch
import torch.nn as nn

import dptrain


def idx(name, offset):
    with gzip.open("/usr/share/datasets/fashion-mnist/" + name + ".gz") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


X = (idx("train-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)[:10000] / 255).astype(np.float32)
y = idx("train-labels-idx1-ubyte", 8)[:10000]
Xt = (idx("t10k-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28) / 255).astype(np.float32)
yt = idx("t10k-labels-idx1-ubyte", 8)

net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Flatten(), nn.Linear(16 * 14 * 14, 10))
m = dptrain.from_torch(net, (1, 28, 28))
m.fit(X, y, epochs=2, batch_size=64, workers=2, lr=0.05, momentum=0.9, normalize="none", verbose=1)
net.load_state_dict(m.to_torch())
net.eval()
with torch.no_grad():
    acc = (net(torch.from_numpy(Xt)).argmax(1).numpy() == yt).mean()
print("PyTorch's accuracy %.4f, dptrain's %.4f" % (acc, m.evaluate(Xt, yt)["accuracy"]))
