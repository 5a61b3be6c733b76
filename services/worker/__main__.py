"""``python -m millpond.services.worker``: run a query worker."""

from __future__ import annotations

import asyncio

from millpond.services.worker.app import Worker
from millpond.shared import logs
from millpond.shared.config import WorkerSettings


def main() -> None:
    """Read settings from the environment (and MILLPOND_CONFIG_FILE) and serve."""
    settings = WorkerSettings()
    logs.configure(f"worker:{settings.worker_id}", settings.log_level)
    asyncio.run(serve(settings))


async def serve(settings: WorkerSettings) -> None:
    """Build the service inside the event loop (aiokafka needs a running loop) and run it."""
    await Worker(settings).run()


if __name__ == "__main__":
    main()
