"""``python -m millpond.services.coordinator``: run the coordinator."""

from __future__ import annotations

import asyncio

from millpond.services.coordinator.app import Coordinator
from millpond.shared import logs
from millpond.shared.config import CoordinatorSettings


def main() -> None:
    """Read settings from the environment (and MILLPOND_CONFIG_FILE) and serve."""
    settings = CoordinatorSettings()
    logs.configure("coordinator", settings.log_level)
    asyncio.run(serve(settings))


async def serve(settings: CoordinatorSettings) -> None:
    """Build the service inside the event loop (aiokafka needs a running loop) and run it."""
    await Coordinator(settings).run()


if __name__ == "__main__":
    main()
