from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskId(_message.Message):
    __slots__ = ("query_id", "partition")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    partition: int
    def __init__(self, query_id: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class StoreLag(_message.Message):
    __slots__ = ("task", "active", "current_offset", "end_offset", "lag", "last_applied_ms", "input_offset")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_MS_FIELD_NUMBER: _ClassVar[int]
    INPUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    active: bool
    current_offset: int
    end_offset: int
    lag: int
    last_applied_ms: int
    input_offset: int
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ..., active: _Optional[bool] = ..., current_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., last_applied_ms: _Optional[int] = ..., input_offset: _Optional[int] = ...) -> None: ...
