"""Bad input raises dptrain.Error (ValueError where the input was wrong), with the library's message,
and nothing crashes."""
import os
import unittest

import numpy as np

import dptrain
from common import fashion, scratch


class TestErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.X, cls.y, _, _ = fashion(256, 0)

    def fit(self, X=None, y=None, **kw):
        kw.setdefault("epochs", 1)
        kw.setdefault("workers", 1)
        kw.setdefault("verbose", 0)
        return dptrain.Model(kw.pop("model", "mlp:hidden=16")).fit(self.X if X is None else X,
                                                                   self.y if y is None else y, **kw)

    def assertRaisesMsg(self, exc, text, fn, *a, **kw):
        with self.assertRaises(exc) as cm:
            fn(*a, **kw)
        self.assertIsInstance(cm.exception, dptrain.Error)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def test_hierarchy(self):
        self.assertTrue(issubclass(dptrain.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(dptrain.InvalidArgumentError, dptrain.Error))
        self.assertTrue(issubclass(dptrain.NotFoundError, FileNotFoundError))

    def test_second_fit_on_other_features(self):
        # a fit that continues a model on samples of another size: the sizes named, not the
        # library's complaint about the checkpoint it continues from
        m = dptrain.Model("mlp:hidden=16")
        m.fit(self.X, self.y, epochs=1, workers=1, verbose=0)
        self.assertRaisesMsg(ValueError, "X: samples of 392 values, but this model takes 1 x 28 x 28 = 784",
                             m.fit, np.ascontiguousarray(self.X[:, :14, :]), self.y, verbose=0)
        m.fit(self.X, self.y, epochs=1, workers=1, verbose=0)  # and the model goes on
        self.assertEqual(m.epochs_trained, 2)

    def test_bad_option_value(self):
        e = self.assertRaisesMsg(ValueError, "lr", self.fit, lr="fast")
        self.assertEqual(e.code, -1)  # DP_EINVAL
        self.assertRaisesMsg(ValueError, "epochs", self.fit, epochs=-3)

    def test_unknown_option(self):
        self.assertRaisesMsg(ValueError, "learning_rte", self.fit, learning_rte=0.1)

    def test_option_that_does_not_apply(self):
        # momentum is SGD's: with AdamW it would be silently ignored, so it is refused (as by the CLI)
        self.assertRaisesMsg(ValueError, "momentum", self.fit, optimizer="adamw", momentum=0.9)

    def test_labels_out_of_range(self):
        y = self.y.astype(np.int64)
        y[5] = -1
        self.assertRaisesMsg(ValueError, "label 5", self.fit, y=y)

    def test_float_labels(self):
        self.assertRaisesMsg(ValueError, "float", self.fit, y=self.y.astype(np.float32))

    def test_mismatched_lengths(self):
        self.assertRaisesMsg(ValueError, "255 labels", self.fit, y=self.y[:255])

    def test_bad_shape(self):
        self.assertRaisesMsg(ValueError, "dimensions", self.fit, X=self.X.reshape(256, 1, 1, 28, 28))
        self.assertRaisesMsg(ValueError, "empty", self.fit, X=self.X[:0], y=self.y[:0])

    def test_wrong_dtype(self):
        self.assertRaisesMsg(ValueError, "numbers", self.fit, X=np.array([["a"]] * 256))

    def test_non_contiguous_is_copied_not_refused(self):
        Xs = np.repeat(self.X, 2, axis=2)[:, :, ::2]  # a strided view of the same pixels
        self.assertFalse(Xs.flags["C_CONTIGUOUS"])
        a = dptrain.Model("mlp:hidden=16")
        a.fit(Xs, self.y, epochs=1, workers=1, deterministic=True, verbose=0)
        b = dptrain.Model("mlp:hidden=16")
        b.fit(self.X, self.y, epochs=1, workers=1, deterministic=True, verbose=0)
        self.assertEqual(a.param_hash(), b.param_hash())

    def test_missing_model_file(self):
        self.assertRaisesMsg(FileNotFoundError, "nosuch.txt", dptrain.Model, "models/nosuch.txt")
        self.assertRaisesMsg(FileNotFoundError, "no.ckpt", dptrain.Model.load, "/nonexistent/no.ckpt")

    def test_bad_model_spec(self):
        self.assertRaises(dptrain.Error, self.fit, model="mlp:bogus=1")

    def test_model_shape_mismatch(self):
        m = dptrain.Model("mlp:hidden=16")
        m.fit(self.X, self.y, epochs=1, workers=1, verbose=0)
        self.assertRaisesMsg(ValueError, "the model's", m.evaluate, np.zeros((4, 5), np.float32), np.zeros(4, np.int64))
        self.assertRaisesMsg(ValueError, "classes", m.evaluate, self.X[:4], np.array([0, 1, 2, 99]))

    def test_no_weights(self):
        self.assertRaisesMsg(dptrain.Error, "fit", dptrain.Model("mlp").predict, self.X)

    def test_out_holds_another_run(self):
        d = os.path.join(scratch(), "run")
        self.fit(out=d)
        self.assertRaisesMsg(dptrain.Error, "checkpoint", self.fit, out=d)


if __name__ == "__main__":
    unittest.main()
