"""Ctrl-C during fit: the run stops at a step boundary, writes its checkpoint, and re-raises
KeyboardInterrupt; the checkpoint resumes to the bits of the run never interrupted."""
import os
import signal
import threading
import time
import unittest

import dptrain
from common import fashion, scratch

OPTS = dict(batch_size=32, workers=2, lr=0.05, momentum=0.9, deterministic=True, verbose=0)
EPOCHS = 60


def interrupt_after(metrics, epochs):
    """SIGINT to this process once `metrics` holds `epochs` epoch records (the run is under way)."""
    def watch():
        for _ in range(6000):
            try:
                with open(metrics) as f:
                    if f.read().count('"kind": "epoch"') >= epochs:
                        break
            except OSError:
                pass
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


class TestInterrupt(unittest.TestCase):
    def test_sigint_checkpoint_resume(self):
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
        whole = dptrain.Model("mlp:hidden=64")
        whole.fit(X, y, epochs=EPOCHS, **OPTS)
        self.assertEqual(r.param_hash(), whole.param_hash())


if __name__ == "__main__":
    unittest.main()
