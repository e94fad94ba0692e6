"""A PyTorch model trained by dptrain, and back (docs/python.md): python3 from_torch.py [SAMPLES]"""
import gzip, sys
import numpy as np, torch, torch.nn as nn
import dptrain

def idx(name, offset):  # Debian's dataset-fashion-mnist, as numpy arrays
    return np.frombuffer(gzip.open(f"/usr/share/datasets/fashion-mnist/{name}.gz").read(), np.uint8, offset=offset)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
X = (idx("train-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)[:n] / 255).astype(np.float32)
y = idx("train-labels-idx1-ubyte", 8)[:n]
Xt = (idx("t10k-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28) / 255).astype(np.float32)
yt = idx("t10k-labels-idx1-ubyte", 8)
net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Flatten(), nn.Linear(16 * 14 * 14, 10))
m = dptrain.from_torch(net, (1, 28, 28))  # its weights too
m.fit(X, y, epochs=2, batch_size=64, workers=2, lr=0.02, momentum=0.9, normalize="none", verbose=1)
net.load_state_dict(m.to_torch())
with torch.no_grad():
    acc = (net.eval()(torch.from_numpy(Xt)).argmax(1).numpy() == yt).mean()
print("PyTorch's accuracy %.4f, dptrain's %.4f" % (acc, m.evaluate(Xt, yt)["accuracy"]))
