"""fit, evaluate, predict, save, load, export and parameters on numpy arrays."""
import json
import os
import struct
import unittest

import numpy as np

import dptrain
from dptrain import _lib
from common import fashion, scratch, ckpt_hash


class TestModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.X, cls.y, cls.Xt, cls.yt = fashion(2000, 500)
        cls.dir = scratch()
        cls.m = dptrain.Model("mlp:hidden=128")
        cls.hist = cls.m.fit(cls.X, cls.y, epochs=3, batch_size=64, workers=2, lr=0.05, momentum=0.9,
                             validation_data=(cls.Xt, cls.yt), out=os.path.join(cls.dir, "run"), verbose=0)

    def test_fit_accuracy(self):
        # 3 epochs on 2,000 samples: well above chance (10%)
        self.assertEqual(len(self.hist), 3)
        self.assertGreater(self.hist[-1]["test_acc"], 0.7)
        self.assertLess(self.hist[-1]["train_loss"], self.hist[0]["train_loss"])

    def test_history_is_metrics_jsonl(self):
        # the same epoch records as the run folder's metrics.jsonl (its keys, its values)
        with open(os.path.join(self.dir, "run", "metrics.jsonl")) as f:
            recs = [json.loads(l) for l in f if '"kind": "epoch"' in l]
        self.assertEqual(len(recs), 3)
        for a, b in zip(self.hist, recs):
            for k in ("epoch", "step", "workers", "train_loss", "train_acc", "test_loss", "test_acc", "lr",
                      "skipped_steps", "bytes_sent"):
                self.assertEqual(a[k], b[k], k)
        self.assertEqual(self.hist.history["test_acc"], [r["test_acc"] for r in recs])

    def test_evaluate_and_predict(self):
        ev = self.m.evaluate(self.Xt, self.yt)
        self.assertEqual(set(ev), {"loss", "accuracy"})
        self.assertAlmostEqual(ev["accuracy"], self.hist[-1]["test_acc"], places=6)
        self.assertAlmostEqual(ev["loss"], self.hist[-1]["test_loss"], places=5)
        out = self.m.predict(self.Xt)
        self.assertEqual(out.shape, (500, 10))
        self.assertEqual(out.dtype, np.float32)
        self.assertAlmostEqual(float((out.argmax(1) == self.yt).mean()), ev["accuracy"], places=6)
        # a non-contiguous copy of the same pixels gives the same outputs
        Xf = np.asfortranarray(self.Xt.astype(np.float64))
        np.testing.assert_array_equal(self.m.predict(Xf), out)

    def test_save_load_export(self):
        ck = os.path.join(self.dir, "m.ckpt")
        self.m.save(ck)
        self.assertEqual(ckpt_hash(ck), self.m.param_hash())
        self.assertEqual(ckpt_hash(os.path.join(self.dir, "run", "checkpoint.bin")), self.m.param_hash())
        m2 = dptrain.Model.load(ck)
        self.assertEqual(m2.param_hash(), self.m.param_hash())
        self.assertEqual(m2.evaluate(self.Xt, self.yt), self.m.evaluate(self.Xt, self.yt))
        np.testing.assert_array_equal(m2.predict(self.Xt[:50]), self.m.predict(self.Xt[:50]))
        st = os.path.join(self.dir, "m.safetensors")
        self.m.export_safetensors(st)
        with open(st, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
            blob = f.read()
        params = self.m.parameters()
        self.assertEqual(set(k for k in head if k != "__metadata__"), set(params))
        self.assertEqual(len(head["__metadata__"]["input_mean"].split(",")), 1)  # one channel
        for k, v in params.items():
            a, b = head[k]["data_offsets"]
            np.testing.assert_array_equal(np.frombuffer(blob[a:b], np.float32).reshape(head[k]["shape"]), v)

    def test_load_within_the_first_epoch(self):
        # a checkpoint of a run stopped before its first epoch ended (max_steps) loads too
        out = os.path.join(scratch(), "early")
        m = dptrain.Model("mlp:hidden=16")
        m.fit(self.X, self.y, epochs=1, max_steps=3, out=out, workers=1, verbose=0)
        r = dptrain.Model.load(os.path.join(out, "checkpoint.bin"))
        self.assertEqual((r.epochs_trained, r.param_hash()), (0, m.param_hash()))

    def test_parameters_views(self):
        p = self.m.parameters()
        self.assertEqual(p["fc1.weight"].shape, (128, 784))
        self.assertEqual(p["fc2.bias"].shape, (10,))
        self.assertFalse(p["fc1.weight"].flags.writeable)
        with self.assertRaises(ValueError):
            p["fc1.weight"][0, 0] = 1

    def test_continue_fit(self):
        # a second fit continues the first: more epochs, its optimizer state kept
        m = dptrain.Model("mlp:hidden=32")
        m.fit(self.X[:512], self.y[:512], epochs=1, batch_size=64, workers=1, deterministic=True, verbose=0)
        h = m.fit(self.X[:512], self.y[:512], epochs=1, batch_size=64, workers=1, deterministic=True, verbose=0)
        self.assertEqual([r["epoch"] for r in h], [2])
        one = dptrain.Model("mlp:hidden=32")
        one.fit(self.X[:512], self.y[:512], epochs=2, batch_size=64, workers=1, deterministic=True, verbose=0)
        self.assertEqual(m.param_hash(), one.param_hash())
        self.assertEqual(m.epochs_trained, 2)

    def test_borrowed_or_copied(self):
        for a in (np.zeros((4, 3), np.float32), np.zeros((4, 3), np.uint8), np.zeros(4, np.int64),
                  np.zeros((4, 2, 2), np.float64), np.zeros(4, np.int16), np.zeros(4, np.bool_)):
            arr, d, borrowed = _lib.as_array(a, "a")
            self.assertTrue(borrowed, a.dtype)
            self.assertIs(arr, a)
            self.assertEqual(d.data, a.ctypes.data)
        for a in (np.zeros((4, 3), np.float32, order="F"), np.zeros((4, 6), np.float32)[:, ::2],
                  np.zeros(4, np.float16), np.zeros(4, ">f4"), [[1, 2], [3, 4]], np.zeros(4, np.uint16)):
            arr, d, borrowed = _lib.as_array(a, "a")
            self.assertFalse(borrowed)
            self.assertTrue(arr.flags["C_CONTIGUOUS"])
            self.assertIn(arr.dtype, (np.float32, np.int64))

    def test_regression(self):
        rng = np.random.default_rng(0)
        X = rng.normal(size=(512, 8)).astype(np.float32)
        w = rng.normal(size=(8, 2)).astype(np.float32)
        Y = X @ w
        m = dptrain.Model("mlp:hidden=32")
        h = m.fit(X, Y, epochs=20, batch_size=32, workers=1, loss="mse", lr=0.02, momentum=0.9,
                  validation_split=0.25, verbose=0)
        self.assertIn("test_rmse", h[-1])
        ev = m.evaluate(X, Y)
        self.assertEqual(set(ev), {"loss", "rmse", "mae"})
        self.assertLess(ev["rmse"], 0.5 * float(Y.std()))
        self.assertEqual(m.predict(X[:7]).shape, (7, 2))
        ck = os.path.join(scratch(), "r.ckpt")
        m.save(ck)
        m2 = dptrain.Model.load(ck)
        self.assertEqual(m2.evaluate(X, Y), ev)


if __name__ == "__main__":
    unittest.main()
