"""A test run ended by SIGTERM still tears its session fixtures down (``tests/conftest.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CONFTEST = '''
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def child(tmp_path_factory):
    """A process a session fixture started, as the broker is, in a session of its own."""
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield process
    process.kill()
    process.wait()
    Path(__file__).with_name("torn_down").write_text(str(process.pid))
'''

_TEST = '''
import time
from pathlib import Path


def test_runs_until_terminated(child):
    part = Path(__file__).with_name("started.part")
    part.write_text(str(child.pid))
    part.rename(part.with_name("started"))
    time.sleep(600)
'''


def test_a_terminated_run_tears_its_session_fixtures_down(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_long.py").write_text(textwrap.dedent(_TEST))
    # The project's conftest as a plugin, with its Spark set-up skipped (an operator's conf wins).
    env = {**os.environ, "MILLPOND_SPARK_CONF": "{}"}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                            "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = ""
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert run.poll() is None, run.communicate()[0].decode()
            assert time.monotonic() < deadline, "the test never started"
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        started = tmp_path / "started"
        child = int(started.read_text()) if started.exists() else None
        if child is not None and not (tmp_path / "torn_down").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)  # left running: this test's own clean-up
    assert (tmp_path / "torn_down").exists(), f"the fixture was not torn down; the run said:\n{output}"
    assert (tmp_path / "torn_down").read_text() == str(child)
    assert run.returncode == 2, output  # pytest's "interrupted"
