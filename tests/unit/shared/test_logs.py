"""The JSON log lines: tracebacks only where something went wrong unexpectedly."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from millpond.shared import logs


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    """``logs.configure`` writing to a buffer (the root logger and the filtered ones put back after)."""
    root, filtered = logging.getLogger(), [logging.getLogger(n) for n in ("py4j.clientserver", "grpc._cython.cygrpc")]
    saved = root.handlers[:], root.level, [logger.filters[:] for logger in filtered]
    logs.configure("test")
    out = io.StringIO()
    root.handlers[0].setStream(out)  # type: ignore[attr-defined]
    yield out
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for logger, filters in zip(filtered, saved[2], strict=True):
        logger.filters[:] = filters


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def raised(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as error:
        return error


def test_an_error_record_keeps_its_traceback(configured: io.StringIO) -> None:
    logging.getLogger("millpond.x").error("stopping failed", exc_info=raised("disk gone"))
    (entry,) = lines(configured)
    assert "Traceback (most recent call last)" in str(entry["exc"]) and "error" not in entry


def test_a_warning_says_its_error_in_one_line(configured: io.StringIO) -> None:
    logging.getLogger("millpond.x").warning("batch failed", exc_info=raised("fenced\nby a newer producer"),
                                            extra={"batch": 3})
    (entry,) = lines(configured)
    assert entry["error"] == "RuntimeError: fenced" and "exc" not in entry and entry["batch"] == 3


def test_py4j_callback_errors_are_left_to_the_callback(configured: io.StringIO) -> None:
    py4j = logging.getLogger("py4j.clientserver")
    try:
        raise RuntimeError("the batch failed")
    except RuntimeError:
        py4j.exception("There was an exception while executing the Python Proxy on the Python Side.")
        py4j.exception("Could not authenticate connection.")
    (entry,) = lines(configured)
    assert entry["msg"] == "Could not authenticate connection." and "exc" in entry


def test_reason_of_an_error_without_a_message() -> None:
    assert logs.reason(TimeoutError()) == "TimeoutError"


def test_an_answer_grpc_could_not_send_to_a_gone_caller_is_one_info_line(configured: io.StringIO) -> None:
    logging.getLogger("grpc._cython.cygrpc").error(
        "ExecuteBatchError raised in core by servicer method [/millpond.router.v1.RouterService/GetClusterStatus]",
        exc_info=raised('Failed "execute_batch"'))
    (entry,) = lines(configured)
    assert entry["level"] == "INFO" and "exc" not in entry and "error" not in entry
    assert entry["method"] == "/millpond.router.v1.RouterService/GetClusterStatus"
