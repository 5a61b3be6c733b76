"""A benchmark told to stop (SIGTERM) while its asyncio tasks refuse to end still removes
its cluster and exits: the soak once hung this way with its broker down mid-restart."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import asyncio, signal, sys
from pathlib import Path
from bench.common import exit_handler

marker = Path(sys.argv[1])
signal.signal(signal.SIGTERM, exit_handler(lambda: marker.write_text("removed"), grace_s=1.0))

async def stubborn() -> None:
    while True:  # as a task waiting on a broker that is gone: every cancel is swallowed
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

async def main() -> None:
    asyncio.get_running_loop().create_task(stubborn())
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_a_stop_that_cannot_unwind_removes_the_cluster_and_exits(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.wait()
    assert marker.read_text() == "removed"
