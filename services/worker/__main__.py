"""``python -m millpond.services.worker``: run a query worker."""

from __future__ import annotations

import os

# Before gRPC is imported: with its fork support on, a fork that runs Python in the child (as
# PySpark's launch of its JVM does, with a preexec_fn) runs gRPC's at-fork handlers there,
# and while the server is busy those crashed the child before it could exec (SIGSEGV or
# SIGABRT): "Java gateway process exited before sending its port number", then a retry
# about 2 s later, in 3 of 12 worker starts of bench.freshness. The worker's children are
# all exec'd at once, so none uses gRPC. 100 such forks beside a busy grpc.aio server: 15
# crashed with it on, none with it off.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import asyncio
import sys

from millpond.services.worker.app import Worker
from millpond.shared import logs
from millpond.shared.config import WorkerSettings


def main() -> None:
    """Read settings from the environment (and MILLPOND_CONFIG_FILE) and serve."""
    settings = WorkerSettings()
    logs.configure(f"worker:{settings.worker_id}", settings.log_level)
    # Each call into Spark's JVM waits for its answer without the interpreter lock and must take
    # it back from whichever thread holds it (a batch's reduce, the processing loop), which gives
    # it up only after the switch interval. A new runner's prepare (73 calls) beside a thread
    # spinning in Python, idle session: 484 ms at the median at Python's 5 ms, 180 at 1 ms, 88
    # at 0.5 ms. Under bench.failover's kill (standby reads, five alternated pairs) the moved
    # partition's query started a median 0.23 s after its task against 0.19, its processing
    # back 1.14 s after detection against 1.15: no difference the noise lets through there, nor
    # in bench.freshness (p99 514 / 567 ms against 470 / 559); bench.idle 2.47-2.63% of a core
    # per worker against 2.67-3.03 (two pairs each).
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000)
    asyncio.run(serve(settings))


async def serve(settings: WorkerSettings) -> None:
    """Build the service inside the event loop (aiokafka needs a running loop) and run it."""
    await Worker(settings).run()


if __name__ == "__main__":
    main()
