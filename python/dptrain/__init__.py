"""dptrain from Python: numpy arrays in, a trained data-parallel model out (docs/python.md).

    import numpy as np, dptrain
    m = dptrain.Model("cnn")
    hist = m.fit(X, y, epochs=5, batch_size=128, workers=2, lr=0.05, momentum=0.9,
                 validation_data=(Xv, yv), out="runs/cnn")
    m.evaluate(Xv, yv)      # {'loss': ..., 'accuracy': ...}
    m.predict(Xv)           # (N, classes) logits

Pure Python over libdptrain.so (ctypes), numpy its only dependency.
"""
from ._lib import Error, InvalidArgumentError, NotFoundError, path as library_path
from .model import History, Model, job, rank, world

__all__ = ["Model", "History", "Error", "InvalidArgumentError", "NotFoundError", "options", "rank", "world",
           "job", "library_path", "from_torch"]
__version__ = "0.1.0"


def options():
    """The options fit() takes, as the CLI names them (dptrain train --help), in snake_case."""
    from ._lib import lib
    out, i = [], 0
    while True:
        n = lib.dp_train_option_name(i)
        if not n:
            return out
        out.append(n.decode().replace("-", "_"))
        i += 1


def from_torch(module, input_shape):
    """A dptrain Model of a torch.nn.Sequential (Linear, Conv2d, BatchNorm2d, ReLU, GELU, Dropout,
    MaxPool2d, AdaptiveAvgPool2d((1, 1)), Flatten, LayerNorm), starting from its weights; input_shape
    is one sample's, (C, H, W) or (D,).  m.to_torch() gives the trained weights back as a state_dict
    for the same module.  Needs torch (imported only here)."""
    from ._torch import from_torch as f
    return f(module, input_shape)
