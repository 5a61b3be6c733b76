from millpond.common.v1 import rows_pb2 as _rows_pb2
from millpond.coordinator.v1 import coordinator_pb2 as _coordinator_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StreamQueryRequest(_message.Message):
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

class StreamQueryResponse(_message.Message):
    __slots__ = ("header", "row")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    header: StreamHeader
    row: _rows_pb2.Row
    def __init__(self, header: _Optional[_Union[StreamHeader, _Mapping]] = ..., row: _Optional[_Union[_rows_pb2.Row, _Mapping]] = ...) -> None: ...

class StreamHeader(_message.Message):
    __slots__ = ("query_id", "columns")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    columns: _containers.RepeatedCompositeFieldContainer[_rows_pb2.Column]
    def __init__(self, query_id: _Optional[str] = ..., columns: _Optional[_Iterable[_Union[_rows_pb2.Column, _Mapping]]] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterStatusResponse(_message.Message):
    __slots__ = ("cluster", "router_hosts", "push_queries")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ROUTER_HOSTS_FIELD_NUMBER: _ClassVar[int]
    PUSH_QUERIES_FIELD_NUMBER: _ClassVar[int]
    cluster: _coordinator_pb2.GetClusterStatusResponse
    router_hosts: _containers.RepeatedCompositeFieldContainer[RouterHostView]
    push_queries: int
    def __init__(self, cluster: _Optional[_Union[_coordinator_pb2.GetClusterStatusResponse, _Mapping]] = ..., router_hosts: _Optional[_Iterable[_Union[RouterHostView, _Mapping]]] = ..., push_queries: _Optional[int] = ...) -> None: ...

class RouterHostView(_message.Message):
    __slots__ = ("endpoint", "worker_id", "alive", "last_beat_age_ms")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_BEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    worker_id: str
    alive: bool
    last_beat_age_ms: int
    def __init__(self, endpoint: _Optional[str] = ..., worker_id: _Optional[str] = ..., alive: _Optional[bool] = ..., last_beat_age_ms: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("sql", "properties", "consistency_token", "request_id")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SQL_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    sql: str
    properties: _containers.ScalarMap[str, str]
    consistency_token: str
    request_id: str
    def __init__(self, sql: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., consistency_token: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_rows_pb2.StatementResult]
    def __init__(self, results: _Optional[_Iterable[_Union[_rows_pb2.StatementResult, _Mapping]]] = ...) -> None: ...
