"""Structured logging: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """Formats a record as JSON with time, level, logger, message and any ``extra`` fields."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(service: str, level: str = "INFO") -> None:
    """Send every log record to stderr as JSON lines, tagged with ``service``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiokafka", "py4j", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Metadata for a just-created topic lags a moment; aiokafka retries, and says so loudly.
    logging.getLogger("aiokafka.cluster").setLevel(logging.CRITICAL)
