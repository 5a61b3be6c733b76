"""Malformed protobuf requests for bench/fuzz: raw bytes for one RPC's request type,
seeded so a run can be replayed.

Kinds: random bytes; a valid message (random field values) cut short; a field sent with the
wrong wire type; a varint that never ends; a length prefix longer than the message; invalid
UTF-8 in a string field; unknown field numbers; a message field nested past protobuf's
recursion limit; oversized fields (up to past the services' 4 MiB message limit); and
well-formed messages with random field values (they reach the services' domain code).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
_INTS = (0, 1, -1, 7, 2**31 - 1, -(2**31), 2**32 - 1, 2**53, 2**63 - 1, -(2**63))
_TEXT = ("", "x", "worker-1", "127.0.0.1:1", "readings", "SELECT * FROM readings;", "\x00", "😀", "a" * 1000,
         "../../etc/passwd", "CTAS_AVG_READINGS_1", "grpc.health.v1.Health", "millpond.router.v1.RouterService")


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, LENGTH) + _varint(len(payload)) + payload


def _wire_type(descriptor: FieldDescriptor) -> int:
    if descriptor.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE):
        return LENGTH
    if descriptor.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64):
        return FIXED64
    if descriptor.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32):
        return FIXED32
    return VARINT


def _is_map(descriptor: FieldDescriptor) -> bool:
    return descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    return bool(descriptor.is_repeated)


@dataclass
class MessageFuzzer:
    """Yields request bytes for ``method``'s input type, deterministically for a ``seed``."""

    method: MethodDescriptor
    seed: int = 0
    oversized: bool = True
    """Whether to send fields of megabytes (some past the 4 MiB limit)."""
    rng: random.Random = field(init=False)
    kinds: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}:{self.method.full_name}")
        self.descriptor: Descriptor = self.method.input_type
        self.message_class: type[Message] = message_factory.GetMessageClass(self.descriptor)
        kinds: list[tuple[str, Callable[[], bytes]]] = [
            ("random_bytes", self._random_bytes), ("truncated", self._truncated), ("wrong_wire_type", self._wrong_wire),
            ("endless_varint", self._endless_varint), ("long_length_prefix", self._long_length_prefix),
            ("invalid_utf8", self._invalid_utf8), ("unknown_fields", self._unknown_fields),
            ("deep_nesting", self._deep_nesting), ("random_valid", self._random_valid),
            ("random_valid", self._random_valid), ("random_valid", self._random_valid),
        ]
        self._kinds = kinds

    def message(self) -> tuple[str, bytes]:
        """One request's kind and bytes."""
        # Megabytes per message: rare, or the run is spent copying them.
        kind, make = ("oversized", self._oversized) if self.oversized and self.rng.random() < 0.005 \
            else self.rng.choice(self._kinds)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        return kind, make()

    def _fields(self) -> list[FieldDescriptor]:
        return list(self.descriptor.fields)

    def _random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.choice((0, 1, 2, 5, 16, 64, 512)))

    def _truncated(self) -> bytes:
        data = self._random_valid()
        return data[:self.rng.randrange(len(data))] if len(data) > 1 else b"\x0a"

    def _wrong_wire(self) -> bytes:
        fields = self._fields()
        number = self.rng.choice(fields).number if fields else 1
        wire = self.rng.choice([w for w in (VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32)
                                if not fields or w != _wire_type(self.rng.choice(fields))])
        payload = {VARINT: _varint(self.rng.choice(_INTS)), FIXED64: self.rng.randbytes(8),
                   LENGTH: _varint(3) + b"abc", START_GROUP: b"", END_GROUP: b"", FIXED32: self.rng.randbytes(4)}[wire]
        return self._random_valid() + _tag(number, wire) + payload

    def _endless_varint(self) -> bytes:
        return _tag(self.rng.randint(1, 8), VARINT) + b"\xff" * self.rng.choice((10, 11, 64))

    def _long_length_prefix(self) -> bytes:
        return _tag(self.rng.randint(1, 8), LENGTH) + _varint(self.rng.choice((5, 1000, 2**31, 2**63))) + b"abc"

    def _invalid_utf8(self) -> bytes:
        strings = [f for f in self._fields() if f.type == FieldDescriptor.TYPE_STRING]
        number = self.rng.choice(strings).number if strings else 1
        return _length_delimited(number, self.rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b")))

    def _unknown_fields(self) -> bytes:
        number = self.rng.choice((99, 1000, 536870911))
        return self._random_valid() + _length_delimited(number, self.rng.randbytes(8)) + _tag(number + 1, VARINT) + b"\x01"

    def _deep_nesting(self) -> bytes:
        """A message field wrapped in itself (or any field number) past the recursion limit."""
        messages = [f for f in self._fields() if f.type == FieldDescriptor.TYPE_MESSAGE]
        number = self.rng.choice(messages).number if messages else self.rng.randint(1, 4)
        data = b""
        for _ in range(self.rng.choice((101, 1000, 20_000))):
            data = _length_delimited(number, data)
        return data

    def _oversized(self) -> bytes:
        strings = [f for f in self._fields() if f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)]
        number = self.rng.choice(strings).number if strings else 1
        size = self.rng.choice((70_000, 1 << 20, 3 << 20, 5 << 20))
        return _length_delimited(number, b"x" * size)

    def _random_valid(self) -> bytes:
        message = self.message_class()
        self._fill(message, 0)
        data: bytes = message.SerializeToString()
        return data

    def _fill(self, message: Message, depth: int) -> None:
        for descriptor in message.DESCRIPTOR.fields:
            if self.rng.random() < 0.3:
                continue
            if _is_map(descriptor):
                entries = getattr(message, descriptor.name)
                key_field, value_field = descriptor.message_type.fields_by_name["key"], descriptor.message_type.fields_by_name["value"]
                for _ in range(self.rng.choice((0, 1, 3))):
                    key = self._scalar(key_field)
                    if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        self._fill(entries[key], depth + 1)
                    else:
                        entries[key] = self._scalar(value_field)
            elif descriptor.type == FieldDescriptor.TYPE_MESSAGE:
                if depth >= 3:
                    continue
                if _is_repeated(descriptor):
                    for _ in range(self.rng.choice((0, 1, 3))):
                        self._fill(getattr(message, descriptor.name).add(), depth + 1)
                else:
                    self._fill(getattr(message, descriptor.name), depth + 1)
                    getattr(message, descriptor.name).SetInParent()
            elif _is_repeated(descriptor):
                getattr(message, descriptor.name).extend(self._scalar(descriptor) for _ in range(self.rng.choice((0, 1, 3))))
            else:
                setattr(message, descriptor.name, self._scalar(descriptor))

    def _scalar(self, descriptor: FieldDescriptor) -> Any:
        kind = descriptor.type
        if kind == FieldDescriptor.TYPE_STRING:
            return self.rng.choice(_TEXT)
        if kind == FieldDescriptor.TYPE_BYTES:
            return self.rng.randbytes(self.rng.choice((0, 4, 32)))
        if kind == FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return self.rng.choice((0.0, -1.5, 1e300, float("inf"), float("-inf"), float("nan")))
        if kind == FieldDescriptor.TYPE_ENUM:
            return self.rng.choice([v.number for v in descriptor.enum_type.values] + [-1, 99])
        bits = 64 if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64,
                              FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64) else 32
        unsigned = kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED32,
                            FieldDescriptor.TYPE_FIXED64)
        low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return min(max(self.rng.choice(_INTS), low), high)
