"""from_torch -> fit -> to_torch: an nn.Sequential trained here, its weights back in PyTorch
giving dptrain's outputs and accuracy; its own weights as the start; unsupported layers refused."""
import unittest

import numpy as np

import dptrain
from common import fashion

try:
    import torch
    import torch.nn as nn
except ImportError:  # (scripts/install-deps.sh --torch installs it)
    torch = None


@unittest.skipIf(torch is None, "no torch (apt-get install python3-torch)")
class TestTorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        X, y, Xt, yt = fashion(2000, 500)
        cls.X = (X / np.float32(255)).astype(np.float32).reshape(-1, 1, 28, 28)
        cls.Xt = (Xt / np.float32(255)).astype(np.float32).reshape(-1, 1, 28, 28)
        cls.y, cls.yt = y, yt
        torch.manual_seed(0)

    def test_cnn_round_trip(self):
        net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d((1, 1)),
                            nn.Flatten(), nn.Dropout(0.1), nn.Linear(16, 10))
        m = dptrain.from_torch(net, (1, 28, 28))
        # normalize="none": the inputs PyTorch gets are the ones dptrain trains on
        m.fit(self.X, self.y, epochs=2, batch_size=64, workers=2, lr=0.05, momentum=0.9, normalize="none",
              verbose=0)
        net.load_state_dict(m.to_torch())
        net.eval()
        with torch.no_grad():
            ref = net(torch.from_numpy(self.Xt)).numpy()
        out = m.predict(self.Xt)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        acc_torch = float((ref.argmax(1) == self.yt).mean())
        self.assertEqual(acc_torch, m.evaluate(self.Xt, self.yt)["accuracy"])
        self.assertGreater(acc_torch, 0.2)  # (chance: 0.1; a small net after 2 epochs)

    def test_starts_from_torch_weights(self):
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.LayerNorm(32), nn.GELU(approximate="tanh"),
                            nn.Linear(32, 10))
        m = dptrain.from_torch(net, (1, 28, 28))
        m.fit(self.X[:256], self.y[:256], epochs=1, batch_size=64, workers=1, lr=1e-12, normalize="none",
              verbose=0)  # (a step that moves nothing)
        p = m.to_torch()
        self.assertEqual(list(p), list(net.state_dict()))
        for k, v in net.state_dict().items():
            np.testing.assert_allclose(p[k], v.numpy(), atol=1e-6)

    def test_table_input(self):
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        rng = np.random.default_rng(0)
        F = rng.normal(size=(300, 8)).astype(np.float32)
        m = dptrain.from_torch(net, (8,))
        m.fit(F, rng.integers(0, 3, 300), epochs=1, batch_size=32, workers=1, normalize="none", verbose=0)
        net.load_state_dict(m.to_torch())
        with torch.no_grad():
            np.testing.assert_allclose(m.predict(F), net(torch.from_numpy(F)).numpy(), rtol=1e-4, atol=1e-5)

    def test_unsupported_refused_by_name(self):
        with self.assertRaises(ValueError) as cm:
            dptrain.from_torch(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()), (4,))
        self.assertIn("layer 1 (Sigmoid)", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            dptrain.from_torch(nn.Sequential(nn.Conv2d(1, 2, (3, 5))), (1, 8, 8))
        self.assertIn("not square", str(cm.exception))
        with self.assertRaises(ValueError):
            dptrain.from_torch(nn.Linear(4, 4), (4,))


if __name__ == "__main__":
    unittest.main()
