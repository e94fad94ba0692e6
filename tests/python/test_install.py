"""The package installed: `pip install ./python` into a venv, offline with Debian's setuptools, and
the installed package finding the library `make install` put in a prefix (by its soname)."""
import os
import shutil
import subprocess
import sys
import unittest

from common import ROOT, scratch

PROBE = """
import numpy as np, dptrain
print("library", dptrain.library_path)
print("package", dptrain.__file__)
rng = np.random.default_rng(1)
X = rng.normal(size=(256, 4)).astype(np.float32)
y = (X[:, 0] > 0).astype(np.int64)
m = dptrain.Model("mlp:hidden=8")
h = m.fit(X, y, epochs=5, batch_size=32, workers=1, lr=0.1, verbose=0)
print("acc", m.evaluate(X, y)["accuracy"])
"""


class TestInstall(unittest.TestCase):
    def test_pip_install_venv_and_make_install(self):
        d = scratch()
        venv = os.path.join(d, "venv")
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                           capture_output=True, text=True)
        if r.returncode and "ensurepip" in r.stderr + r.stdout:
            self.skipTest("no venv module (apt-get install python3-venv)")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        py = os.path.join(venv, "bin", "python")
        src = os.path.join(d, "src")  # (a copy: setuptools writes build/ and *.egg-info beside the sources)
        shutil.copytree(os.path.join(ROOT, "python"), src, ignore=shutil.ignore_patterns("__pycache__"))
        r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", src],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # the library `make install` put in a prefix, found by its soname on the loader's path
        build = os.path.relpath(os.path.dirname(os.environ["DPTRAIN_LIB"]), ROOT)
        prefix = os.path.join(d, "prefix")
        r = subprocess.run(["make", "-s", "-C", ROOT, "BUILD=" + build, "install", "PREFIX=" + prefix,
                            "LDCONFIG=true"], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        env = {k: v for k, v in os.environ.items() if k not in ("DPTRAIN_LIB", "PYTHONPATH")}
        env["LD_LIBRARY_PATH"] = os.path.join(prefix, "lib")
        r = subprocess.run([py, "-c", PROBE], cwd=d, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = dict(l.split(" ", 1) for l in r.stdout.splitlines())
        self.assertEqual(out["library"], "libdptrain.so.0")
        self.assertTrue(out["package"].startswith(venv), out["package"])
        self.assertGreater(float(out["acc"]), 0.8)


if __name__ == "__main__":
    unittest.main()
