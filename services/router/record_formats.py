"""PRINT's reading of a topic it knows nothing about: which formats its keys and values could be
in, and each record shown in the first of them (ksqlDB's ``RecordFormatter``).

Every format starts out possible; a record's bytes that a format cannot read rule that format
out for the rest of the PRINT, so the list narrows as records go by and is shown with each
row (``JSON``, ``KAFKA_STRING``, ``KAFKA_BIGINT or KAFKA_DOUBLE or KAFKA_STRING``). A key may
also be a windowed table's (``TUMBLING(KAFKA_STRING)``: the key, then the window's start in 8
bytes; ``SESSION(..)``: the key, the session's end and start; Kafka Streams' and Millpond's
windowed keys). Bytes no format reads are shown as ``0x`` and their hex.

Unlike ksqlDB, text with control characters other than tab, newline and carriage return is
no KAFKA_STRING (nor JSON), so a number in a binary format is not shown as garbled text; a
window's bounds must be times from 1970 to the year 9999, so a text key of 9 bytes or more is not
read as a windowed one; and there are no schema registry formats (Millpond has no registry).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from millpond.shared.kafka.serde import WINDOW_START_BYTES
from millpond.shared.sql.java_text import java_double_text
from millpond.shared.sql.planner import LATEST_ROWTIME_MS

UNRECOGNISED = "UNRECOGNISED"
"""The format named when no format reads every record seen: each is shown as ``0x`` and its hex."""

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _text(data: bytes) -> str:
    """The bytes as text: UTF-8, not empty, with no control characters but tab and line ends."""
    text = data.decode()  # UnicodeDecodeError is a ValueError
    if not text or _CONTROL.search(text) or "\ufffd" in text:
        raise ValueError("not text")
    return text


def _json(data: bytes) -> str:
    text = _text(data)
    json.loads(text, parse_constant=_no_constant)
    return text


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _fixed(size: int, layout: str, show: Callable[[float], str] = str) -> Callable[[bytes], str]:
    def read(data: bytes) -> str:
        if len(data) != size:
            raise ValueError(f"not {size} bytes")
        return show(struct.unpack(layout, data)[0])
    return read


FORMATS: dict[str, Callable[[bytes], str]] = {
    "JSON": _json,
    "KAFKA_INT": _fixed(4, ">i"),
    "KAFKA_BIGINT": _fixed(8, ">q"),
    "KAFKA_DOUBLE": _fixed(8, ">d", java_double_text),
    "KAFKA_STRING": _text,
}
"""The formats tried, in the order of ksqlDB's: a record is shown in the first one still possible."""


def _long(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _bound(data: bytes) -> int:
    """A window bound's 8 bytes as epoch ms, ValueError where no window has it (Kafka's windows
    refuse a negative start; this also the years past 9999, which rules out text's last 8 bytes,
    a number of 2e18 or more, as a window's start)."""
    ms = _long(data)
    if not 0 <= ms <= LATEST_ROWTIME_MS:
        raise ValueError(f"{ms} is no window bound")
    return ms


def _session(inner: Callable[[bytes], str]) -> Callable[[bytes], str]:
    width = 2 * WINDOW_START_BYTES

    def read(data: bytes) -> str:
        if len(data) < width:
            raise ValueError("too short for a session's key")
        end, start = _bound(data[-width:-WINDOW_START_BYTES]), _bound(data[-WINDOW_START_BYTES:])
        if end < start:
            raise ValueError("a session ends before it starts")
        return f"[{inner(data[:-width])}@{start}/{end}]"
    return read


def _time_window(inner: Callable[[bytes], str]) -> Callable[[bytes], str]:
    def read(data: bytes) -> str:
        if len(data) < WINDOW_START_BYTES:
            raise ValueError("too short for a windowed key")
        # a time window's end is not in its key
        return f"[{inner(data[:-WINDOW_START_BYTES])}@{_bound(data[-WINDOW_START_BYTES:])}/-]"
    return read


def _key_formats() -> dict[str, Callable[[bytes], str]]:
    """Each format, after its SESSION, HOPPING and TUMBLING windowed forms (ksqlDB's order)."""
    formats: dict[str, Callable[[bytes], str]] = {}
    for name, read in FORMATS.items():
        formats[f"SESSION({name})"] = _session(read)
        formats[f"HOPPING({name})"] = _time_window(read)
        formats[f"TUMBLING({name})"] = _time_window(read)
        formats[name] = read
    return formats


@dataclass
class PossibleFormats:
    """The formats that read every key (or value) seen so far, narrowed record by record."""

    possible: dict[str, Callable[[bytes], str]]
    seen: bool = field(default=False, init=False)

    @classmethod
    def of_keys(cls) -> PossibleFormats:
        return cls(_key_formats())

    @classmethod
    def of_values(cls) -> PossibleFormats:
        return cls(dict(FORMATS))

    def shown(self, data: bytes | None) -> str | None:
        """The bytes as the first format still possible shows them, ruling out those that cannot
        read them; ``0x`` and hex when none can; None for None (a tombstone's value)."""
        if data is None:
            return None
        self.seen = True
        first = None
        for name, read in list(self.possible.items()):
            try:
                text = read(data)
            except (ValueError, struct.error):
                del self.possible[name]
                continue
            first = text if first is None else first
        return "0x" + data.hex() if first is None else first

    def names(self) -> str | None:
        """The formats still possible, ``A or B``; ``UNRECOGNISED`` when none is; None before any
        bytes were seen."""
        if not self.seen:
            return None
        return " or ".join(self.possible) or UNRECOGNISED
