"""pytest's hooks for the Python stage (tests/python/run.sh): one line per test as it ends
("ok   python FILE.TEST (Ns)", "FAIL python ..." with its traceback, "skip python ... (why)"),
and the stage's count line "python: N passed, N failed, N skipped", which scripts/test.sh
tallies.  A skipped test fails the run when CI is set (CI=true), as in the other stages."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # common.py
_count = {"passed": 0, "failed": 0, "skipped": 0}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """pytest's own terminal output off (its options stay): these hooks print the stage's lines"""
    tr = config.pluginmanager.getplugin("terminalreporter")
    if tr:
        config.pluginmanager.unregister(tr)


def _name(report):
    path, *rest = report.nodeid.split("::")
    return "%s.%s" % (os.path.splitext(os.path.basename(path))[0], rest[-1] if rest else "(import)")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _count["passed"] += 1
        print("ok   python %s (%.1fs)" % (_name(report), report.duration), flush=True)
    elif report.failed:  # a failing test, or its setup or teardown
        _count["failed"] += 1
        print("FAIL python %s (%s)" % (_name(report), report.when), flush=True)
        print("    " + str(report.longrepr).strip().replace("\n", "\n    "), flush=True)
    elif report.skipped:
        _count["skipped"] += 1
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        print("skip python %s (%s)" % (_name(report), why), flush=True)


def pytest_collectreport(report):
    if report.failed:  # a file that does not import
        _count["failed"] += 1
        print("FAIL python %s (collect)" % report.nodeid, flush=True)
        print("    " + str(report.longrepr).strip().replace("\n", "\n    "), flush=True)


def pytest_sessionfinish(session, exitstatus):
    ci = os.environ.get("CI", "")
    strict = ci not in ("", "0") and ci.lower() != "false"
    if _count["skipped"] and strict:
        print("CI=%s: %d skipped fail the run (scripts/install-deps.sh installs what they need)"
              % (ci, _count["skipped"]))
        session.exitstatus = 1
    print("python: %(passed)d passed, %(failed)d failed, %(skipped)d skipped" % _count, flush=True)
