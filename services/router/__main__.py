"""``python -m millpond.services.router``: run the router."""

from __future__ import annotations

import asyncio

from millpond.services.router.app import Router
from millpond.shared import logs
from millpond.shared.config import RouterSettings


def main() -> None:
    """Read settings from the environment (and MILLPOND_CONFIG_FILE) and serve."""
    settings = RouterSettings()
    logs.configure("router", settings.log_level)
    asyncio.run(serve(settings))


async def serve(settings: RouterSettings) -> None:
    """Build the service inside the event loop (aiokafka needs a running loop) and run it."""
    await Router(settings).run()


if __name__ == "__main__":
    main()
