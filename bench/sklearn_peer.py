#!/usr/bin/python3
"""dptrain against scikit-learn's MLP on data no one here made (issue 29's target).

For each of scikit-learn's bundled sets, digits, breast_cancer, wine (classes) and diabetes
(regression): a fixed, seeded 80/20 split (train_test_split, random_state 0, stratified for
classes), written as .npy and as CSV.  scikit-learn trains MLPClassifier / MLPRegressor with
hidden_layer_sizes=(64,) on StandardScaler'd features; dptrain trains mlp:hidden=64 from both
files with --normalize auto (the same standardisation, per feature) and scikit-learn's own
recipe: Adam, learning rate 1e-3, batch min(200, n), as many epochs as its max_iter.

    /usr/bin/python3 bench/sklearn_peer.py [DPTRAIN] [WORKERS]

Prints one row per set and format (test accuracy or RMSE, wall seconds of both), then the
targets: accuracy within 1 point of scikit-learn's on digits and within 2 test samples on
breast_cancer and wine; RMSE at most 1.05x scikit-learn's on diabetes.  Exit 1 if one misses.
"""
import os, re, subprocess, sys, tempfile, time, warnings

import numpy as np
from sklearn import datasets
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.preprocessing import StandardScaler

DPTRAIN = sys.argv[1] if len(sys.argv) > 1 else "./build/dptrain"
WORKERS = sys.argv[2] if len(sys.argv) > 2 else "2"
SETS = [("digits", 200), ("breast_cancer", 200), ("wine", 200), ("diabetes", 2000)]  # (name, max_iter)


def write(d, name, X, y, Xt, yt):
    """The split as X.npy/y.npy pairs and as CSV files with a header and a 'target' column."""
    np.save(f"{d}/{name}_x.npy", X), np.save(f"{d}/{name}_y.npy", y)
    np.save(f"{d}/{name}_xt.npy", Xt), np.save(f"{d}/{name}_yt.npy", yt)
    head = ",".join([f"f{i}" for i in range(X.shape[1])] + ["target"])
    for suffix, a, b in (("", X, y), ("_test", Xt, yt)):
        np.savetxt(f"{d}/{name}{suffix}.csv", np.column_stack([a, b]), delimiter=",", header=head, comments="",
                   fmt=["%.17g"] * X.shape[1] + ["%.17g" if name == "diabetes" else "%d"])


def dptrain(args):
    t = time.time()
    out = subprocess.run([DPTRAIN, "train"] + args, capture_output=True, text=True)
    dt = time.time() - t
    if out.returncode:
        sys.exit(f"dptrain failed: {' '.join(args)}\n{out.stderr}")
    m = re.search(r"^done: .*test (acc ([0-9.]+)%|rmse ([0-9.e+]+))", out.stdout, re.M)
    return float(m.group(2) or m.group(3)), dt


def main():
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    d = tempfile.mkdtemp(prefix="dptrain-sklearn-")
    fails = []
    print(f"{'set':14} {'samples':>8} {'side':22} {'test':>9} {'errors':>6} {'seconds':>8}")
    for name, iters in SETS:
        X, y = getattr(datasets, "load_" + name)(return_X_y=True)
        reg = name == "diabetes"
        X, Xt, y, yt = train_test_split(X, y, test_size=0.2, random_state=0, stratify=None if reg else y)
        write(d, name, X, y, Xt, yt)
        s = StandardScaler().fit(X)
        M = (MLPRegressor if reg else MLPClassifier)(hidden_layer_sizes=(64,), random_state=0, max_iter=iters)
        t = time.time()
        M.fit(s.transform(X), y)
        sk_s = time.time() - t
        p = M.predict(s.transform(Xt))
        sk = float(np.sqrt(np.mean((p - yt) ** 2))) if reg else 100 * float(np.mean(p == yt))
        unit = "rmse" if reg else "acc %"
        row = lambda side, v, s: print(f"{name:14} {len(X):>8} {side:22} {v:9.3f} "
                                       f"{'' if reg else round((100 - v) * len(yt) / 100):>6} {s:8.2f}")
        row(f"scikit-learn ({M.n_iter_} it)", sk, sk_s)
        common = ["--model", "mlp:hidden=64", "--optim", "adamw", "--lr", "0.001", "--batch",
                  str(min(200, len(X))), "--epochs", str(iters), "--workers", WORKERS, "--progress", "none"]
        if reg:
            common += ["--loss", "mse"]
        for fmt, src in (("npy", ["--data", f"{d}/{name}_x.npy", "--labels", f"{d}/{name}_y.npy", "--test-data",
                                  f"{d}/{name}_xt.npy", "--test-labels", f"{d}/{name}_yt.npy"]),
                         ("csv", ["--data", f"{d}/{name}.csv", "--label-column", "target", "--test-data",
                                  f"{d}/{name}_test.csv"])):
            v, dt = dptrain(src + common)
            row(f"dptrain {fmt}", v, dt)
            if reg:
                ok = v <= 1.05 * sk
                want = f"rmse {v:.3f} <= 1.05 x {sk:.3f}"
            elif name == "digits":
                ok = v >= sk - 1.0
                want = f"acc {v:.2f}% >= {sk:.2f}% - 1 point"
            else:
                ok = (sk - v) * len(yt) / 100 <= 2 + 1e-9
                want = f"acc {v:.2f}% within 2 of {len(yt)} test samples of {sk:.2f}%"
            print(f"  target {name} {fmt}: {want}: {'met' if ok else 'NOT MET'}")
            if not ok:
                fails.append(f"{name} {fmt}")
        print(f"  ({unit}; dptrain seconds include starting the process and reading the data)")
    print("all targets met" if not fails else f"targets not met: {', '.join(fails)}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
