"""What the Python tests share: the data (the first samples of Fashion-MNIST as numpy arrays),
the CLI and a scratch folder."""
import gzip
import os
import re
import subprocess
import tempfile

import numpy as np

ROOT = os.environ.get("DPTRAIN_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("DPTRAIN_CLI") or os.path.join(ROOT, "build", "dptrain")
DATA = os.environ.get("DP_DATA", "/usr/share/datasets/fashion-mnist")
_cache = {}


def _idx(name, offset):
    for n in (name + ".gz", name):
        p = os.path.join(DATA, n)
        if os.path.exists(p):
            with (gzip.open(p) if n.endswith(".gz") else open(p, "rb")) as f:
                return np.frombuffer(f.read(), np.uint8, offset=offset)
    raise FileNotFoundError(os.path.join(DATA, name) + " (apt-get install dataset-fashion-mnist)")


def fashion(n_train=2000, n_test=500):
    """(X, y, Xt, yt): uint8 (N, 28, 28) images and uint8 labels, the first samples of each split."""
    if "f" not in _cache:
        _cache["f"] = (_idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28),
                       _idx("train-labels-idx1-ubyte", 8),
                       _idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28),
                       _idx("t10k-labels-idx1-ubyte", 8))
    X, y, Xt, yt = _cache["f"]
    return (np.ascontiguousarray(X[:n_train]), np.ascontiguousarray(y[:n_train]),
            np.ascontiguousarray(Xt[:n_test]), np.ascontiguousarray(yt[:n_test]))


def scratch():
    return tempfile.mkdtemp(prefix="dptrain-pytest-")


def cli_hash(*args, cwd=None):
    """Runs `dptrain train ARGS... --out DIR` and returns the param hash of its checkpoint
    (`dptrain ckpt info`)."""
    out = os.path.join(cwd or scratch(), "cli-run")
    r = subprocess.run([CLI, "train", *args, "--out", out, "--overwrite", "--progress", "none"], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return ckpt_hash(os.path.join(out, "checkpoint.bin"))


def ckpt_hash(path):
    r = subprocess.run([CLI, "ckpt", "info", path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return re.search(r"param hash: +([0-9a-f]{16})", r.stdout).group(1)


def mpirun2(script_text, folder, *args):
    """Runs script_text (written into folder) as 2 processes under mpirun, on this machine's
    loopback; the completed process, its output captured.  None without mpirun (the caller
    skips)."""
    import shutil
    import sys
    if not shutil.which("mpirun"):
        return None
    script = os.path.join(folder, "mpi_script.py")
    with open(script, "w") as f:
        f.write(script_text)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_pml=os.environ.get("OMPI_MCA_pml", "ob1"), OMPI_MCA_btl="self,tcp",
               OMPI_MCA_btl_tcp_if_include="lo")
    return subprocess.run(["mpirun", "--oversubscribe", "-np", "2", sys.executable, script] + list(args),
                          env=env, capture_output=True, text=True, timeout=300)
