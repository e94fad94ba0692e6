"""examples/python/ run as a user runs them (with fewer samples): the CNN on numpy arrays with 2
workers, and the from_torch model whose accuracy PyTorch reproduces from to_torch's weights."""
import os
import re
import subprocess
import sys
import unittest

from common import ROOT, scratch


def run(script, samples):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", script), str(samples)],
                       cwd=scratch(), env=env, capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise AssertionError("%s exited %d:\n%s%s" % (script, p.returncode, p.stdout, p.stderr))
    return p.stdout


class TestExamples(unittest.TestCase):
    def test_readme_shows_train_cnn(self):
        with open(os.path.join(ROOT, "README.md")) as f, \
                open(os.path.join(ROOT, "examples", "python", "train_cnn.py")) as g:
            self.assertIn("```python\n" + g.read() + "```", f.read())

    def test_train_cnn(self):
        out = run("train_cnn.py", 2560)
        acc = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
        self.assertGreater(acc, 50, out)
        self.assertRegex(out, r"param hash [0-9a-f]{16}")

    def test_from_torch(self):
        out = run("from_torch.py", 2560)
        m = re.search(r"PyTorch's accuracy ([0-9.]+), dptrain's ([0-9.]+)", out)
        self.assertIsNotNone(m, out)
        self.assertAlmostEqual(float(m.group(1)), float(m.group(2)), delta=0.002)
        self.assertGreater(float(m.group(2)), 0.5, out)
