from millpond.common.v1 import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportWorkerStatusRequest(_message.Message):
    __slots__ = ("worker_id", "endpoint", "lags")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAGS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    lags: _containers.RepeatedCompositeFieldContainer[_status_pb2.StoreLag]
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., lags: _Optional[_Iterable[_Union[_status_pb2.StoreLag, _Mapping]]] = ...) -> None: ...

class ReportWorkerStatusResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamWorkerStatusRequest(_message.Message):
    __slots__ = ("status", "last")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    status: ReportWorkerStatusRequest
    last: bool
    def __init__(self, status: _Optional[_Union[ReportWorkerStatusRequest, _Mapping]] = ..., last: _Optional[bool] = ...) -> None: ...

class StreamWorkerStatusResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
