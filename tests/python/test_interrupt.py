"""Ctrl-C during fit: the run stops at a step boundary, writes its checkpoint, and re-raises
KeyboardInterrupt; the checkpoint resumes to the bits of the run never interrupted."""
import os
import signal
import threading
import time
import unittest

import numpy as np

import dptrain
from common import fashion, mpirun2, scratch

MPI_SCRIPT = """
import sys, numpy as np, dptrain
sys.path.insert(0, %r)
from test_interrupt import interrupt_after, OPTS, EPOCHS
X, y, out = np.load(sys.argv[1]), np.load(sys.argv[2]), sys.argv[3]
if dptrain.rank() == 1:  # a SIGTERM to one process stops the job (as mpirun or Slurm sends it)
    interrupt_after(out + "/metrics.jsonl", 3, __import__("signal").SIGTERM)
try:
    dptrain.Model("mlp:hidden=64").fit(X, y, epochs=EPOCHS, out=out, **dict(OPTS, workers=1))
    print("rank %%d ran to the end" %% dptrain.rank(), flush=True)
except SystemExit as e:
    print("rank %%d stopped, exit %%s" %% (dptrain.rank(), e.code), flush=True)
except KeyboardInterrupt as e:
    print("rank %%d stopped: %%s" %% (dptrain.rank(), e), flush=True)
""" % os.path.dirname(os.path.abspath(__file__))

OPTS = dict(batch_size=32, workers=2, lr=0.05, momentum=0.9, deterministic=True, verbose=0)
EPOCHS = 60


def interrupt_after(metrics, epochs, sig=signal.SIGINT):
    """sig to this process once `metrics` holds `epochs` epoch records (the run is under way)."""
    def watch():
        for _ in range(6000):
            try:
                with open(metrics) as f:
                    if f.read().count('"kind": "epoch"') >= epochs:
                        break
            except OSError:
                pass
            time.sleep(0.005)
        os.kill(os.getpid(), sig)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


class TestInterrupt(unittest.TestCase):
    def test_sigint_checkpoint_resume(self):
        # Python's Ctrl-C handler, whatever this process inherited: a shell starts a background
        # job (the suite run with `&`) with SIGINT ignored, and Python then installs none
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        X, y, _, _ = fashion(1000, 0)
        out = os.path.join(scratch(), "run")
        watcher = interrupt_after(os.path.join(out, "metrics.jsonl"), 3)
        m = dptrain.Model("mlp:hidden=64")
        with self.assertRaises(KeyboardInterrupt):
            m.fit(X, y, epochs=EPOCHS, out=out, **OPTS)
        watcher.join()
        ck = os.path.join(out, "checkpoint.bin")
        self.assertTrue(os.path.exists(ck))
        # the model stays usable: its weights are the checkpoint's
        r = dptrain.Model.load(ck)
        self.assertEqual(r.param_hash(), m.param_hash())
        self.assertLess(r.epochs_trained, EPOCHS)  # stopped before the end
        r.fit(X, y, epochs=EPOCHS - r.epochs_trained, out=out, **OPTS)
        self.assertEqual(r.param_hash(), self.whole(X, y))

    _whole = None

    @classmethod
    def whole(cls, X, y):
        """The hash of the run never stopped."""
        if cls._whole is None:
            m = dptrain.Model("mlp:hidden=64")
            m.fit(X, y, epochs=EPOCHS, **OPTS)
            cls._whole = m.param_hash()
        return cls._whole

    def test_sigterm_exits_143_with_checkpoint(self):
        X, y, _, _ = fashion(1000, 0)
        out = os.path.join(scratch(), "run")
        watcher = interrupt_after(os.path.join(out, "metrics.jsonl"), 3, signal.SIGTERM)
        with self.assertRaises(SystemExit) as cm:
            dptrain.Model("mlp:hidden=64").fit(X, y, epochs=EPOCHS, out=out, **OPTS)
        watcher.join()
        self.assertEqual(cm.exception.code, 143)
        self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)  # (fit's handler gone)
        r = dptrain.Model.load(os.path.join(out, "checkpoint.bin"))
        self.assertLess(r.epochs_trained, EPOCHS)

    def test_mpirun_sigterm_to_one_rank(self):
        # SIGTERM to rank 1 of 2: both stop at the same step, rank 0 writes the checkpoint; rank 1
        # exits 143, rank 0's fit raises KeyboardInterrupt (the job was stopped); the checkpoint
        # resumes (here on 2 threads) to the run never stopped
        X, y, _, _ = fashion(1000, 0)
        d = scratch()
        out = os.path.join(d, "run")
        np.save(os.path.join(d, "X.npy"), X), np.save(os.path.join(d, "y.npy"), y)
        r = mpirun2(MPI_SCRIPT, d, os.path.join(d, "X.npy"), os.path.join(d, "y.npy"), out)
        if r is None:
            self.skipTest("no mpirun (apt-get install openmpi-bin)")
        self.assertIn("rank 0 stopped: the job was stopped after step", r.stdout, r.stdout + r.stderr)
        self.assertIn("rank 1 stopped, exit 143", r.stdout, r.stdout + r.stderr)
        m = dptrain.Model.load(os.path.join(out, "checkpoint.bin"))
        self.assertLess(m.epochs_trained, EPOCHS)
        m.fit(X, y, epochs=EPOCHS - m.epochs_trained, out=out, **OPTS)
        self.assertEqual(m.param_hash(), self.whole(X, y))


if __name__ == "__main__":
    unittest.main()
