#!/usr/bin/env python3
"""Writes tests/fixtures/optim_ref.bin: parameters after each of 3 steps of
torch.optim.SGD and torch.optim.AdamW (PyTorch 1.13, single-tensor path) on a
fixed small problem, read by tests/test_optim.c (optim_torch_fixture).

Layout, little endian:
    char[4]  magic "DPFX"
    u32      version (1)
    u32      n, steps, ncases
    f32      p0[n]                 initial parameters
    f32      grads[steps][n]       gradient fed at each step
    ncases times:
        u32  kind                  0 SGD, 1 AdamW (enum dp_optim_kind)
        f32  lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps
        f32  p[steps][n]           parameters after each step

Every hyperparameter is rounded to float32 first, so that PyTorch (which keeps
them as Python floats) and the C code (float fields) use the same numbers.

Usage: python3 tests/torch/gen_optim_fixture.py [out.bin]
"""
import struct
import sys

import torch

N, STEPS = 16, 3


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


CASES = [
    # kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps
    (0, 0.1, 0.9, 0.0, 1e-4, 1, 0.9, 0.999, 1e-8),  # SGD Nesterov + L2
    (0, 0.05, 0.8, 0.25, 0.01, 0, 0.9, 0.999, 1e-8),  # SGD dampening
    (1, 0.01, 0.0, 0.0, 0.01, 0, 0.9, 0.999, 1e-8),  # AdamW, torch defaults
    (1, 0.003, 0.0, 0.0, 0.1, 0, 0.8, 0.95, 1e-6),  # AdamW, other betas
]


def run(case, p0, grads):
    kind, lr, mom, damp, wd, nest, b1, b2, eps = [f32(v) if i else v for i, v in enumerate(case)]
    p = torch.nn.Parameter(p0.clone())
    if kind == 0:
        opt = torch.optim.SGD([p], lr=lr, momentum=mom, dampening=damp, weight_decay=wd,
                              nesterov=bool(nest), foreach=False)
    else:
        opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                                foreach=False)
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return (kind, lr, mom, damp, wd, float(nest), b1, b2, eps), out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/optim_ref.bin"
    gen = torch.Generator().manual_seed(1234)
    p0 = torch.randn(N, generator=gen, dtype=torch.float32)
    grads = [torch.randn(N, generator=gen, dtype=torch.float32) for _ in range(STEPS)]
    blob = bytearray(b"DPFX")
    blob += struct.pack("<4I", 1, N, STEPS, len(CASES))
    blob += p0.numpy().astype("<f4").tobytes()
    for g in grads:
        blob += g.numpy().astype("<f4").tobytes()
    for case in CASES:
        hp, out = run(case, p0, grads)
        blob += struct.pack("<I8f", hp[0], *hp[1:])
        for p in out:
            blob += p.numpy().astype("<f4").tobytes()
    with open(path, "wb") as f:
        f.write(blob)
    print(f"wrote {path}: {len(blob)} bytes, torch {torch.__version__}")


if __name__ == "__main__":
    main()
