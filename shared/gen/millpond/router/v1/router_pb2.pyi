from millpond.common.v1 import rows_pb2 as _rows_pb2
from millpond.coordinator.v1 import coordinator_pb2 as _coordinator_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportHostStatusRequest(_message.Message):
    __slots__ = ("worker_id", "endpoint", "lags")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAGS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    lags: _containers.RepeatedCompositeFieldContainer[_coordinator_pb2.StoreLag]
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., lags: _Optional[_Iterable[_Union[_coordinator_pb2.StoreLag, _Mapping]]] = ...) -> None: ...

class ReportHostStatusResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("sql", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SQL_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    sql: str
    properties: _containers.ScalarMap[str, str]
    def __init__(self, sql: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_rows_pb2.StatementResult]
    def __init__(self, results: _Optional[_Iterable[_Union[_rows_pb2.StatementResult, _Mapping]]] = ...) -> None: ...
