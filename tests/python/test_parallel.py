"""Data parallelism from Python: worker threads with the GIL released, and the deterministic
guarantee (workers=1, workers=2, the CLI on the same data as .npy, and mpirun -np 2 give one hash)."""
import json
import os
import re
import subprocess
import threading
import unittest

import numpy as np

import dptrain
from common import CLI, ROOT, cli_hash, fashion, mpirun2, scratch

OPTS = dict(epochs=2, batch_size=64, lr=0.05, momentum=0.9, deterministic=True, verbose=0)
CLI_OPTS = ["--model", "mlp:hidden=64", "--epochs", "2", "--batch", "64", "--lr", "0.05", "--momentum", "0.9",
            "--deterministic"]
MPI_SCRIPT = """
import sys, numpy as np, dptrain
X, y = np.load(sys.argv[1]), np.load(sys.argv[2])
m = dptrain.Model("mlp:hidden=64")
m.fit(X, y, workers=1, epochs=2, batch_size=64, lr=0.05, momentum=0.9, deterministic=True, verbose=0)
print("rank %d of %d hash %s" % (dptrain.rank(), dptrain.world(), m.param_hash()), flush=True)
"""


class TestParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.X, cls.y, _, _ = fashion(512, 0)
        cls.dir = scratch()
        np.save(os.path.join(cls.dir, "X.npy"), cls.X)
        np.save(os.path.join(cls.dir, "y.npy"), cls.y)
        cls.hashes = {}
        for w in (1, 2):
            m = dptrain.Model("mlp:hidden=64")
            m.fit(cls.X, cls.y, workers=w, **OPTS)
            cls.hashes[w] = m.param_hash()

    def test_workers_1_and_2_same_bits(self):
        self.assertEqual(self.hashes[1], self.hashes[2])

    def test_pipeline_one_micro_batch_same_bits(self):
        # pipeline parallelism from Python (pp=, micro_batches=: the CLI's --pp, --micro-batches):
        # two stages with one micro-batch sum what one worker sums, in its order: one worker's bits
        # (not deterministic mode, which --pp refuses: the plain run's hash)
        plain = {k: v for k, v in OPTS.items() if k != "deterministic"}
        a, b = dptrain.Model("mlp:hidden=64"), dptrain.Model("mlp:hidden=64")
        a.fit(self.X, self.y, workers=1, **plain)
        b.fit(self.X, self.y, workers=2, pp=2, micro_batches=1, **plain)
        self.assertEqual(a.param_hash(), b.param_hash())
        # each stage held its own layers; after fit the model is whole again on the first worker
        np.testing.assert_array_equal(a.predict(self.X[:50]), b.predict(self.X[:50]))
        self.assertEqual(a.evaluate(self.X, self.y), b.evaluate(self.X, self.y))
        with self.assertRaisesRegex(dptrain.InvalidArgumentError, "--pp must divide --workers"):
            dptrain.Model("mlp:hidden=64").fit(self.X, self.y, workers=3, pp=2, **plain)

    def test_zero_unit_same_bits(self):
        # ZeRO 3 with a unit from Python (zero=, zero_unit_mb=: the CLI's --zero, --zero-unit-mb):
        # the first layer (64 x 784 weights, 200 kB) gathered, computed and reduce-scattered in
        # slices of 16 rows; deterministic: one worker's bits with the same unit.  After fit the
        # shards are whole again in the first worker: predict, evaluate, parameters() and the export
        # read them
        a, b = dptrain.Model("mlp:hidden=64"), dptrain.Model("mlp:hidden=64")
        a.fit(self.X, self.y, workers=1, zero_unit_mb=0.05, **OPTS)
        b.fit(self.X, self.y, workers=2, zero=3, zero_unit_mb=0.05, **OPTS)
        self.assertEqual(a.param_hash(), b.param_hash())
        np.testing.assert_array_equal(a.predict(self.X[:50]), b.predict(self.X[:50]))
        self.assertEqual(a.evaluate(self.X, self.y), b.evaluate(self.X, self.y))
        pa, pb = a.parameters(), b.parameters()
        self.assertEqual(sorted(pa), sorted(pb))
        for k in pa:
            np.testing.assert_array_equal(pa[k], pb[k])
        fa, fb = os.path.join(self.dir, "unit_a.safetensors"), os.path.join(self.dir, "unit_b.safetensors")
        a.export_safetensors(fa)
        b.export_safetensors(fb)
        with open(fa, "rb") as x, open(fb, "rb") as z:
            self.assertEqual(x.read(), z.read())

    def test_tensor_parallel_matches_one_worker(self):
        # tensor parallelism from Python (tp=: the CLI's --tp): a gpt whose blocks are split 2 ways
        # within a group of 2 threads trains one worker's model, to float rounding (a split layer
        # sums 2 partial products where one worker sums one)
        tok = os.path.join(self.dir, "tokens.bin")
        subprocess.run([CLI, "prepare-text", "--out", tok], check=True, capture_output=True)
        gpt = "gpt:layers=2,heads=4,dim=16,ctx=8"
        opts = dict(data=tok, epochs=1, batch_size=8, lr=3e-3, optim="adamw", max_steps=20, verbose=0)
        a, b = dptrain.Model(gpt), dptrain.Model(gpt)
        a.fit(workers=1, **opts)
        b.fit(workers=2, tp=2, **opts)
        pa, pb = a.parameters(), b.parameters()
        self.assertEqual(sorted(pa), sorted(pb))
        top = max(float(np.abs(v).max()) for v in pa.values())
        diff = max(float(np.abs(pa[k] - pb[k]).max()) for k in pa)
        self.assertLess(diff / top, 1e-5)
        self.assertNotEqual(a.param_hash(), b.param_hash())  # (the sums really are split)
        with self.assertRaisesRegex(dptrain.InvalidArgumentError, "--tp must divide --workers"):
            dptrain.Model(gpt).fit(workers=3, tp=2, **opts)

    def test_cli_same_bits(self):
        h = cli_hash("--data", "X.npy", "--labels", "y.npy", "--workers", "2", *CLI_OPTS, cwd=self.dir)
        self.assertEqual(h, self.hashes[1])

    def test_files_same_bits(self):
        # X=None: the data options name files, as the CLI's do
        m = dptrain.Model("mlp:hidden=64")
        m.fit(data=os.path.join(self.dir, "X.npy"), labels=os.path.join(self.dir, "y.npy"), workers=2, **OPTS)
        self.assertEqual(m.param_hash(), self.hashes[1])

    def test_digits_accuracy_is_the_clis(self):
        # scikit-learn's digits (float64 (N, 64) features, int labels): fit's test accuracy is the
        # CLI's on the same arrays as .npy, the same seed
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            self.skipTest("no scikit-learn (apt-get install python3-sklearn)")
        X, y = load_digits(return_X_y=True)
        d = self.dir
        for name, a in (("dx", X[:1400]), ("dy", y[:1400]), ("tx", X[1400:]), ("ty", y[1400:])):
            np.save(os.path.join(d, name + ".npy"), a)
        m = dptrain.Model("mlp:hidden=64")
        h = m.fit(X[:1400], y[:1400], validation_data=(X[1400:], y[1400:]), epochs=5, batch_size=32, lr=0.05,
                  momentum=0.9, workers=2, seed=7, verbose=0)
        self.assertGreater(h[-1]["test_acc"], 0.85)
        self.assertAlmostEqual(m.evaluate(X[1400:], y[1400:])["accuracy"], h[-1]["test_acc"], places=6)
        out = os.path.join(d, "digits-cli")
        r = subprocess.run([CLI, "train", "--data", "dx.npy", "--labels", "dy.npy", "--test-data", "tx.npy",
                            "--test-labels", "ty.npy", "--model", "mlp:hidden=64", "--epochs", "5", "--batch", "32",
                            "--lr", "0.05", "--momentum", "0.9", "--workers", "2", "--seed", "7", "--out", out,
                            "--progress", "none"], cwd=d, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            cli = [json.loads(l) for l in f if '"kind": "epoch"' in l]
        self.assertEqual(h[-1]["test_acc"], cli[-1]["test_acc"])

    def test_mpirun_same_bits(self):
        self.mpirun(MPI_SCRIPT)

    def test_mpirun_after_mpi4py(self):
        # mpi4py imported first initialises MPI; the library joins it (and leaves the end to mpi4py)
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            self.skipTest("no mpi4py (apt-get install python3-mpi4py)")
        self.mpirun("from mpi4py import MPI\n" + MPI_SCRIPT +
                    "assert MPI.COMM_WORLD.allgather(dptrain.rank()) == [0, 1]\n")

    def mpirun(self, text):
        r = mpirun2(text, self.dir, os.path.join(self.dir, "X.npy"), os.path.join(self.dir, "y.npy"))
        if r is None:
            self.skipTest("no mpirun (apt-get install openmpi-bin)")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # (the two processes' lines may interleave in mpirun's output)
        found = sorted(re.findall(r"rank (\d) of (\d) hash ([0-9a-f]{16})", r.stdout))
        self.assertEqual(found, [("0", "2", self.hashes[1]), ("1", "2", self.hashes[1])], r.stdout + r.stderr)

    def test_gil_released(self):
        # another Python thread runs while fit trains on 2 workers
        ticks, done = [0], threading.Event()

        def count():
            while not done.is_set():
                ticks[0] += 1
        th = threading.Thread(target=count)
        th.start()
        try:
            m = dptrain.Model("mlp:hidden=64")
            m.fit(self.X, self.y, workers=2, epochs=3, batch_size=32, verbose=0)
        finally:
            done.set()
            th.join()
        self.assertGreater(ticks[0], 1000)


if __name__ == "__main__":
    unittest.main()
