"""Structured logging: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """Formats a record as JSON with time, level, logger, message and any ``extra`` fields.

    An error attached to a record at ERROR or above comes with its traceback (``exc``);
    below that it is a failure the code expected and recovers from (a fenced zombie, a
    restarting query), and one line says what it was (``error``)."""

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
        if record.exc_info and record.exc_info[1] is not None:
            if record.levelno >= logging.ERROR:
                entry["exc"] = self.formatException(record.exc_info)
            else:
                entry["error"] = reason(record.exc_info[1])
        return json.dumps(entry, default=str)


def reason(error: BaseException) -> str:
    """An error in one line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class CallerGone(logging.Filter):
    """grpc logs an answer it could not send because its caller had gone (cancelled, or past
    its deadline) as an ERROR with grpc's own traceback; for a server that is an everyday
    event, said here in one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("ExecuteBatchError raised in core by servicer method"):
            method = message.rpartition("[")[2].rstrip("]")
            record.msg, record.args = "the caller went away before its answer was sent", ()
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            record.method = method
        return True


class CallbackErrors(logging.Filter):
    """Drops py4j's record of an error raised by a Python callback the JVM called (a
    ``foreachBatch`` function): the error goes back to the JVM, which fails the query, and
    the callback's owner reports it once, in one line, where it knows what it means."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("There was an exception while executing the Python Proxy")


def configure(service: str, level: str = "INFO") -> None:
    """Send every log record to stderr as JSON lines, tagged with ``service``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiokafka", "py4j", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("py4j.clientserver").addFilter(CallbackErrors())
    logging.getLogger("grpc._cython.cygrpc").addFilter(CallerGone())
    # Metadata for a just-created topic lags a moment; aiokafka retries, and says so loudly.
    logging.getLogger("aiokafka.cluster").setLevel(logging.CRITICAL)
