from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetMetastoreDigestRequest(_message.Message):
    __slots__ = ("catch_up",)
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    catch_up: bool
    def __init__(self, catch_up: _Optional[bool] = ...) -> None: ...

class GetMetastoreDigestResponse(_message.Message):
    __slots__ = ("digest", "command_offset", "node", "sources", "queries", "failed_commands", "errors")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    COMMAND_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    FAILED_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    digest: str
    command_offset: int
    node: str
    sources: int
    queries: int
    failed_commands: int
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digest: _Optional[str] = ..., command_offset: _Optional[int] = ..., node: _Optional[str] = ..., sources: _Optional[int] = ..., queries: _Optional[int] = ..., failed_commands: _Optional[int] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...
