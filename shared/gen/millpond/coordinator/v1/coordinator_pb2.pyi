from millpond.common.v1 import rows_pb2 as _rows_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_STARTING: _ClassVar[TaskState]
    TASK_STATE_RESTORING: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_STOPPING: _ClassVar[TaskState]

class ElectionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELECTION_STATE_UNSPECIFIED: _ClassVar[ElectionState]
    ELECTION_STATE_FOLLOWING: _ClassVar[ElectionState]
    ELECTION_STATE_ELECTING: _ClassVar[ElectionState]
    ELECTION_STATE_LEADING: _ClassVar[ElectionState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_STARTING: TaskState
TASK_STATE_RESTORING: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_STOPPING: TaskState
ELECTION_STATE_UNSPECIFIED: ElectionState
ELECTION_STATE_FOLLOWING: ElectionState
ELECTION_STATE_ELECTING: ElectionState
ELECTION_STATE_LEADING: ElectionState

class ExecuteStatementRequest(_message.Message):
    __slots__ = ("sql", "properties", "request_id", "attempt")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SQL_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    sql: str
    properties: _containers.ScalarMap[str, str]
    request_id: str
    attempt: int
    def __init__(self, sql: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class ExecuteStatementResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _rows_pb2.StatementResult
    def __init__(self, result: _Optional[_Union[_rows_pb2.StatementResult, _Mapping]] = ...) -> None: ...

class TaskId(_message.Message):
    __slots__ = ("query_id", "partition")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    partition: int
    def __init__(self, query_id: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class WorkerAssignment(_message.Message):
    __slots__ = ("worker_id", "endpoint", "active_tasks", "standby_tasks", "warmup_tasks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    STANDBY_TASKS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_TASKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    active_tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    standby_tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    warmup_tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., active_tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., standby_tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., warmup_tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("generation", "workers")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAssignment]
    def __init__(self, generation: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerAssignment, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "endpoint", "known_generation", "tasks", "lags", "stopping_tasks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    KNOWN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    LAGS_FIELD_NUMBER: _ClassVar[int]
    STOPPING_TASKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    known_generation: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    lags: _containers.RepeatedCompositeFieldContainer[StoreLag]
    stopping_tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., known_generation: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., lags: _Optional[_Iterable[_Union[StoreLag, _Mapping]]] = ..., stopping_tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ...) -> None: ...

class HeartbeatsRequest(_message.Message):
    __slots__ = ("beat", "last")
    BEAT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    beat: HeartbeatRequest
    last: bool
    def __init__(self, beat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., last: _Optional[bool] = ...) -> None: ...

class HeartbeatsResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: HeartbeatResponse
    def __init__(self, answer: _Optional[_Union[HeartbeatResponse, _Mapping]] = ...) -> None: ...

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

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("task", "state", "reason", "failures", "restored_records", "records_to_restore", "input_offset", "start_input_offset", "worker_id")
    TASK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    RESTORED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_TO_RESTORE_FIELD_NUMBER: _ClassVar[int]
    INPUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    START_INPUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    state: TaskState
    reason: str
    failures: int
    restored_records: int
    records_to_restore: int
    input_offset: int
    start_input_offset: int
    worker_id: str
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ..., state: _Optional[_Union[TaskState, str]] = ..., reason: _Optional[str] = ..., failures: _Optional[int] = ..., restored_records: _Optional[int] = ..., records_to_restore: _Optional[int] = ..., input_offset: _Optional[int] = ..., start_input_offset: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class ListTaskStatusesRequest(_message.Message):
    __slots__ = ("query_id",)
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    def __init__(self, query_id: _Optional[str] = ...) -> None: ...

class ListTaskStatusesResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("generation", "assignment", "leader")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    generation: int
    assignment: Assignment
    leader: bool
    def __init__(self, generation: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., leader: _Optional[bool] = ...) -> None: ...

class GetAssignmentRequest(_message.Message):
    __slots__ = ("known_generation",)
    KNOWN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    known_generation: int
    def __init__(self, known_generation: _Optional[int] = ...) -> None: ...

class GetAssignmentResponse(_message.Message):
    __slots__ = ("generation", "assignment", "leader")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    generation: int
    assignment: Assignment
    leader: bool
    def __init__(self, generation: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., leader: _Optional[bool] = ...) -> None: ...

class WatchAssignmentRequest(_message.Message):
    __slots__ = ("known_generation",)
    KNOWN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    known_generation: int
    def __init__(self, known_generation: _Optional[int] = ...) -> None: ...

class WatchAssignmentResponse(_message.Message):
    __slots__ = ("generation", "assignment", "leader")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    generation: int
    assignment: Assignment
    leader: bool
    def __init__(self, generation: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., leader: _Optional[bool] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterStatusResponse(_message.Message):
    __slots__ = ("coordinator_id", "leader", "generation", "hosts", "election", "failed_claims", "last_claim_error")
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    FAILED_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    LAST_CLAIM_ERROR_FIELD_NUMBER: _ClassVar[int]
    coordinator_id: str
    leader: bool
    generation: int
    hosts: _containers.RepeatedCompositeFieldContainer[HostStatus]
    election: ElectionState
    failed_claims: int
    last_claim_error: str
    def __init__(self, coordinator_id: _Optional[str] = ..., leader: _Optional[bool] = ..., generation: _Optional[int] = ..., hosts: _Optional[_Iterable[_Union[HostStatus, _Mapping]]] = ..., election: _Optional[_Union[ElectionState, str]] = ..., failed_claims: _Optional[int] = ..., last_claim_error: _Optional[str] = ...) -> None: ...

class HostStatus(_message.Message):
    __slots__ = ("worker_id", "endpoint", "alive", "last_status_update_ms", "active_tasks", "standby_tasks", "warmup_tasks", "lags", "tasks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_STATUS_UPDATE_MS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    STANDBY_TASKS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_TASKS_FIELD_NUMBER: _ClassVar[int]
    LAGS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    alive: bool
    last_status_update_ms: int
    active_tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    standby_tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    warmup_tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    lags: _containers.RepeatedCompositeFieldContainer[StoreLag]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., alive: _Optional[bool] = ..., last_status_update_ms: _Optional[int] = ..., active_tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., standby_tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., warmup_tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., lags: _Optional[_Iterable[_Union[StoreLag, _Mapping]]] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ...) -> None: ...
