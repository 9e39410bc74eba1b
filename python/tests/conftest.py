"""Shared by the package's tests: where the repository's fixtures are, and the rule that a
test may skip only where CI does not promise what it needs."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPT2_TINY = ROOT / "fixtures" / "models" / "gpt2_tiny.onnx"


def need(module: str, why: str):
    """Imports ``module``, or skips the test saying why; under CI (CI=true, where `.ci/run`
    installs everything) a missing module fails the test instead."""
    try:
        return __import__(module)
    except ImportError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is missing under CI ({why}): {err}")
        pytest.skip(f"needs {module} ({why}): {err}")


# Jobs run a second time because torch's C++ runtime aborted a rank (test_torch_training.py),
# listed at the end of the run so that a retry is never silent.
RETRIED = []


def pytest_terminal_summary(terminalreporter):
    if RETRIED:
        terminalreporter.section("jobs retried after torch's runtime aborted a rank")
        for job, stderr in RETRIED:
            terminalreporter.write_line(f"[{job}] was run again (its test says how that ended); the first run's stderr:")
            terminalreporter.write_line(stderr)
