from millpond.common.v1 import rows_pb2 as _rows_pb2
from millpond.common.v1 import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrepareTakeOverRequest(_message.Message):
    __slots__ = ("tasks", "from_worker_id")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    FROM_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_status_pb2.TaskId]
    from_worker_id: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_status_pb2.TaskId, _Mapping]]] = ..., from_worker_id: _Optional[str] = ...) -> None: ...

class PrepareTakeOverResponse(_message.Message):
    __slots__ = ("standing_by",)
    STANDING_BY_FIELD_NUMBER: _ClassVar[int]
    standing_by: _containers.RepeatedCompositeFieldContainer[_status_pb2.TaskId]
    def __init__(self, standing_by: _Optional[_Iterable[_Union[_status_pb2.TaskId, _Mapping]]] = ...) -> None: ...

class StagePositionsRequest(_message.Message):
    __slots__ = ("query_id", "stage", "input_offsets")
    class InputOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    INPUT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    stage: str
    input_offsets: _containers.ScalarMap[int, int]
    def __init__(self, query_id: _Optional[str] = ..., stage: _Optional[str] = ..., input_offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class StagePositionsResponse(_message.Message):
    __slots__ = ("output_topic", "output_offsets")
    class OutputOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    OUTPUT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    output_topic: str
    output_offsets: _containers.ScalarMap[int, int]
    def __init__(self, output_topic: _Optional[str] = ..., output_offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class SetStandbyReplayRequest(_message.Message):
    __slots__ = ("query_id", "partition", "paused")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    partition: int
    paused: bool
    def __init__(self, query_id: _Optional[str] = ..., partition: _Optional[int] = ..., paused: _Optional[bool] = ...) -> None: ...

class SetStandbyReplayResponse(_message.Message):
    __slots__ = ("changelog_offset",)
    CHANGELOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    changelog_offset: int
    def __init__(self, changelog_offset: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("table", "partition", "key", "allow_standby", "min_input_offset", "wait_ms")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STANDBY_FIELD_NUMBER: _ClassVar[int]
    MIN_INPUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    table: str
    partition: int
    key: bytes
    allow_standby: bool
    min_input_offset: int
    wait_ms: int
    def __init__(self, table: _Optional[str] = ..., partition: _Optional[int] = ..., key: _Optional[bytes] = ..., allow_standby: _Optional[bool] = ..., min_input_offset: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("found", "row", "input_offset")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    INPUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    row: _rows_pb2.Row
    input_offset: int
    def __init__(self, found: _Optional[bool] = ..., row: _Optional[_Union[_rows_pb2.Row, _Mapping]] = ..., input_offset: _Optional[int] = ...) -> None: ...

class LookupStreamRequest(_message.Message):
    __slots__ = ("ids", "lookups")
    IDS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    lookups: _containers.RepeatedCompositeFieldContainer[LookupRequest]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., lookups: _Optional[_Iterable[_Union[LookupRequest, _Mapping]]] = ...) -> None: ...

class LookupStreamResponse(_message.Message):
    __slots__ = ("ids", "answers")
    IDS_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    answers: _containers.RepeatedCompositeFieldContainer[LookupAnswer]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., answers: _Optional[_Iterable[_Union[LookupAnswer, _Mapping]]] = ...) -> None: ...

class LookupAnswer(_message.Message):
    __slots__ = ("response", "code", "message")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    response: LookupResponse
    code: int
    message: str
    def __init__(self, response: _Optional[_Union[LookupResponse, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table", "partitions", "limit", "allow_standby", "min_input_offsets")
    class MinInputOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STANDBY_FIELD_NUMBER: _ClassVar[int]
    MIN_INPUT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    table: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    allow_standby: bool
    min_input_offsets: _containers.ScalarMap[int, int]
    def __init__(self, table: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ..., allow_standby: _Optional[bool] = ..., min_input_offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class ScanPagesRequest(_message.Message):
    __slots__ = ("table", "partitions", "limit", "allow_standby", "min_input_offsets", "statement", "query_id", "wait_ms", "columns")
    class MinInputOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STANDBY_FIELD_NUMBER: _ClassVar[int]
    MIN_INPUT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    table: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    allow_standby: bool
    min_input_offsets: _containers.ScalarMap[int, int]
    statement: str
    query_id: str
    wait_ms: int
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, table: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ..., allow_standby: _Optional[bool] = ..., min_input_offsets: _Optional[_Mapping[int, int]] = ..., statement: _Optional[str] = ..., query_id: _Optional[str] = ..., wait_ms: _Optional[int] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("rows", "input_offsets")
    class InputOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ROWS_FIELD_NUMBER: _ClassVar[int]
    INPUT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[_rows_pb2.Row]
    input_offsets: _containers.ScalarMap[int, int]
    def __init__(self, rows: _Optional[_Iterable[_Union[_rows_pb2.Row, _Mapping]]] = ..., input_offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class ScanPagesResponse(_message.Message):
    __slots__ = ("rows", "row_count", "input_offsets")
    class InputOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    INPUT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    rows: bytes
    row_count: int
    input_offsets: _containers.ScalarMap[int, int]
    def __init__(self, rows: _Optional[bytes] = ..., row_count: _Optional[int] = ..., input_offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...
