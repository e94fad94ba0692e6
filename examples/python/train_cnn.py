"""A CNN on numpy arrays with 2 data-parallel workers (docs/python.md).

    PYTHONPATH=python python3 examples/python/train_cnn.py [SAMPLES]
"""
import gzip
import sys

import numpy as np

import dptrain


def idx(name, offset):  # Debian's dataset-fashion-mnist, as numpy arrays
    with gzip.open("/usr/share/datasets/fashion-mnist/" + name + ".gz") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


n = int(sys.argv[1]) if len(sys.argv) > 1 else 60000
X = idx("train-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)[:n]   # uint8, borrowed as it is
y = idx("train-labels-idx1-ubyte", 8)[:n]
Xt = idx("t10k-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)
yt = idx("t10k-labels-idx1-ubyte", 8)
m = dptrain.Model("cnn")
hist = m.fit(X, y, epochs=2, batch_size=128, workers=2, lr=0.05, momentum=0.9,
             validation_data=(Xt, yt), out="runs/py-cnn", overwrite=True, verbose=1)
print("test accuracy %.2f%%" % (100 * m.evaluate(Xt, yt)["accuracy"]))
print("predicted classes of the first 10 test images:", m.predict(Xt[:10]).argmax(axis=1))
print("param hash", m.param_hash())
