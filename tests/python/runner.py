"""Runs the unittest cases of the files named, one line per test, and the stage's count line.

    python3 tests/python/runner.py tests/python/test_*.py [-k PATTERN]

A skipped test fails the run when CI is set (CI=true), as scripts/test.sh's other stages do."""
import importlib.util
import os
import sys
import time
import unittest


def _short(t):
    return t.id().split(".")[-1]


def _flat(s):
    for t in s:
        if isinstance(t, unittest.TestSuite):
            yield from _flat(t)
        else:
            yield t


class _Result(unittest.TestResult):
    """One line per test as it ends: ok, FAIL (with its traceback) or skip."""

    def __init__(self, module):
        super().__init__()
        self.module, self.passed, self.failed, self.nskipped = module, 0, 0, 0

    def _name(self, t):
        return "%s.%s" % (self.module, _short(t))

    def startTest(self, t):
        super().startTest(t)
        self.t0 = time.time()

    def addSuccess(self, t):
        self.passed += 1
        print("ok   python %s (%.1fs)" % (self._name(t), time.time() - self.t0), flush=True)

    def _fail(self, t, err):
        self.failed += 1
        print("FAIL python %s" % self._name(t), flush=True)
        print("    " + self._exc_info_to_string(err, t).strip().replace("\n", "\n    "), flush=True)

    def addFailure(self, t, err):
        self._fail(t, err)

    def addError(self, t, err):
        self._fail(t, err)

    def addSkip(self, t, reason):
        self.nskipped += 1
        print("skip python %s (%s)" % (self._name(t), reason), flush=True)


def main(argv):
    pattern = None
    if "-k" in argv:
        i = argv.index("-k")
        pattern = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    passed = failed = skipped = 0
    for path in argv:
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            print("FAIL python %s (import: %s: %s)" % (name, type(e).__name__, e), flush=True)
            failed += 1
            continue
        suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
        if pattern:
            suite = unittest.TestSuite(t for t in _flat(suite) if pattern in "%s.%s" % (name, _short(t)))
        r = _Result(name)
        suite.run(r)  # (the suite runs the classes' setUpClass: a failing one fails its tests)
        passed += r.passed
        failed += r.failed
        skipped += r.nskipped
    ci = os.environ.get("CI", "")
    strict = ci not in ("", "0") and ci.lower() != "false"
    if skipped and strict:
        print("CI=%s: %d skipped fail the run (scripts/install-deps.sh installs what they need)" % (ci, skipped))
    print("python: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed or (skipped and strict) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
