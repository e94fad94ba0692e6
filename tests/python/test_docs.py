"""docs/python.md's examples run: its ```python blocks, in order, in one namespace, in a scratch
folder (with the repository's models/ beside it); a block saying "not run by the docs test" is
left out."""
import contextlib
import io
import os
import re
import unittest

from common import ROOT, scratch


class TestDocs(unittest.TestCase):
    def test_python_md_examples(self):
        with open(os.path.join(ROOT, "docs", "python.md")) as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        self.assertGreater(len(blocks), 5)
        d = scratch()
        os.symlink(os.path.join(ROOT, "models"), os.path.join(d, "models"))
        os.makedirs(os.path.join(d, "runs"))
        cwd = os.getcwd()
        ns = {}
        out = io.StringIO()
        try:
            os.chdir(d)
            for i, b in enumerate(blocks):
                if "not run by the docs test" in b:
                    continue
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    try:
                        exec(compile(b, "docs/python.md block %d" % (i + 1), "exec"), ns)
                    except Exception as e:
                        raise AssertionError("block %d: %s: %s\n%s\n--- its output:\n%s"
                                             % (i + 1, type(e).__name__, e, b, out.getvalue()))
        finally:
            os.chdir(cwd)
        # the claims the examples' comments make
        self.assertEqual(ns["hashes"][0], ns["hashes"][1])
        self.assertEqual(ns["m"].epochs_trained, 4)
        self.assertEqual(ns["acc"], ns["t"].evaluate(ns["Xtf"], ns["yt"])["accuracy"])
        self.assertTrue(os.path.exists(os.path.join(d, "runs", "stopped", "checkpoint.bin")))


if __name__ == "__main__":
    unittest.main()
