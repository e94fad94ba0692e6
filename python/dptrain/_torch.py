"""From PyTorch and back: an nn.Sequential of supported layers as a dptrain model file
(docs/models.md) with its weights (a safetensors file the first fit starts from, init_from), and
a trained model's state_dict for the same module.

PyTorch names its Sequential's children "0", "1", ...; a dptrain layer name starts with a letter
or '_', so child "3" is layer "_3" here (its weight "_3.weight"), and back.
"""
import json
import os
import struct
from collections import OrderedDict

import numpy as np

from ._lib import InvalidArgumentError

SUPPORTED = ("Linear", "Conv2d", "BatchNorm2d", "ReLU", "GELU", "Dropout", "MaxPool2d",
             "AdaptiveAvgPool2d((1, 1))", "Flatten", "LayerNorm")


def dp_name(torch_name):
    return "_" + torch_name if torch_name[:1].isdigit() else torch_name


def torch_name(dp_name_):
    return dp_name_[1:] if dp_name_.startswith("_") and dp_name_[1:2].isdigit() else dp_name_


def _square(v, what, name):
    if isinstance(v, (tuple, list)):
        if len(set(v)) != 1:
            raise InvalidArgumentError("from_torch: layer %s: %s %s is not square (dptrain's are)" % (name, what, v))
        v = v[0]
    if not isinstance(v, int):
        raise InvalidArgumentError("from_torch: layer %s: %s %r is not a number" % (name, what, v))
    return v


def _refuse(name, layer, why):
    raise InvalidArgumentError("from_torch: layer %s (%s): %s" % (name, type(layer).__name__, why))


def model_text(module, input_shape):
    """The model file of an nn.Sequential for per-sample inputs input_shape: (C, H, W) or (D,)."""
    import torch.nn as nn
    if not isinstance(module, nn.Sequential):
        raise InvalidArgumentError("from_torch: an nn.Sequential is needed, got %s" % type(module).__name__)
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 3:
        lines = ["input %d %d %d" % shape]
    elif len(shape) == 1:
        lines = ["input 1 1 %d" % shape, "flatten _input"]  # (N, D) arrays: samples of (1, 1, D)
    else:
        raise InvalidArgumentError("from_torch: input_shape (C, H, W) or (D,), got %r" % (input_shape,))
    for name, layer in module.named_children():
        n, t = dp_name(name), type(layer)
        if t is nn.Linear:
            lines.append("linear %s out=%d bias=%d" % (n, layer.out_features, layer.bias is not None))
        elif t is nn.Conv2d:
            if _square(layer.dilation, "dilation", name) != 1 or layer.groups != 1 or layer.padding_mode != "zeros":
                _refuse(name, layer, "dilation, groups and padding modes are not supported")
            if isinstance(layer.padding, str):
                _refuse(name, layer, "padding=%r: give it as a number" % layer.padding)
            lines.append("conv2d %s out=%d kernel=%d stride=%d pad=%d bias=%d" % (
                n, layer.out_channels, _square(layer.kernel_size, "kernel", name),
                _square(layer.stride, "stride", name), _square(layer.padding, "padding", name),
                layer.bias is not None))
        elif t is nn.BatchNorm2d:
            if not layer.affine or not layer.track_running_stats or layer.momentum is None:
                _refuse(name, layer, "needs affine=True, track_running_stats=True and a momentum")
            lines.append("batchnorm %s eps=%r momentum=%r" % (n, float(layer.eps), float(layer.momentum)))
        elif t is nn.ReLU:
            lines.append("relu %s" % n)
        elif t is nn.GELU:
            lines.append(("gelu %s" if getattr(layer, "approximate", "none") == "tanh" else "gelu_erf %s") % n)
        elif t is nn.Dropout:
            lines.append("dropout %s p=%r" % (n, float(layer.p)))
        elif t is nn.MaxPool2d:
            if _square(layer.padding, "padding", name) != 0 or _square(layer.dilation, "dilation", name) != 1 \
                    or layer.ceil_mode:
                _refuse(name, layer, "padding, dilation and ceil_mode are not supported")
            lines.append("maxpool %s kernel=%d stride=%d" % (n, _square(layer.kernel_size, "kernel", name),
                                                             _square(layer.stride, "stride", name)))
        elif t is nn.AdaptiveAvgPool2d:
            if layer.output_size not in (1, (1, 1), [1, 1]):
                _refuse(name, layer, "only AdaptiveAvgPool2d((1, 1)), a global average pool")
            lines.append("global_avgpool %s" % n)
        elif t is nn.Flatten:
            if layer.start_dim != 1 or layer.end_dim != -1:
                _refuse(name, layer, "only Flatten(1, -1)")
            lines.append("flatten %s" % n)
        elif t is nn.LayerNorm:
            if len(layer.normalized_shape) != 1 or not layer.elementwise_affine:
                _refuse(name, layer, "only over the last dimension, with elementwise_affine=True")
            lines.append("layernorm %s eps=%r" % (n, float(layer.eps)))
        else:
            _refuse(name, layer, "not supported (supported: %s)" % ", ".join(SUPPORTED))
    return "\n".join(lines) + "\n"


def write_safetensors(path, tensors):
    """tensors (name -> float32 numpy array) as a safetensors file."""
    header, blobs, at = {}, [], 0
    for k, v in tensors.items():
        b = np.ascontiguousarray(v, dtype="<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def from_torch(module, input_shape):
    """A dptrain Model of an nn.Sequential (its layers: Linear, Conv2d, BatchNorm2d, ReLU, GELU,
    Dropout, MaxPool2d, AdaptiveAvgPool2d((1, 1)), Flatten, LayerNorm; another is refused by name),
    starting from the module's weights (its first fit reads them: init_from).  input_shape: one
    sample's, (C, H, W) for images or (D,) for a table."""
    from .model import Model
    m = Model(model_text(module, input_shape))
    tensors = OrderedDict()
    for k, v in module.state_dict().items():  # (num_batches_tracked too: dptrain keeps it as a float)
        tensors[dp_name(k)] = v.detach().cpu().float().numpy()
    path = os.path.join(m._tmpdir(), "from_torch.safetensors")
    write_safetensors(path, tensors)
    m._defaults["init_from"] = path
    return m


def state_dict(model):
    """model's weights as a PyTorch state_dict (torch tensors, copies) under PyTorch's names (a
    BatchNorm's num_batches_tracked as PyTorch's int64)."""
    import torch
    out = OrderedDict()
    for k, v in model.parameters().items():
        t = torch.from_numpy(np.array(v))
        out[torch_name(k)] = t.long() if k.endswith(".num_batches_tracked") else t
    return out
