from millpond.common.v1 import rows_pb2 as _rows_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("table", "partition", "key", "allow_standby")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STANDBY_FIELD_NUMBER: _ClassVar[int]
    table: str
    partition: int
    key: bytes
    allow_standby: bool
    def __init__(self, table: _Optional[str] = ..., partition: _Optional[int] = ..., key: _Optional[bytes] = ..., allow_standby: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("found", "row")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    found: bool
    row: _rows_pb2.Row
    def __init__(self, found: _Optional[bool] = ..., row: _Optional[_Union[_rows_pb2.Row, _Mapping]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table", "partitions", "limit", "allow_standby")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STANDBY_FIELD_NUMBER: _ClassVar[int]
    table: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    allow_standby: bool
    def __init__(self, table: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ..., allow_standby: _Optional[bool] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[_rows_pb2.Row]
    def __init__(self, rows: _Optional[_Iterable[_Union[_rows_pb2.Row, _Mapping]]] = ...) -> None: ...
