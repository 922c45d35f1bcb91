import datetime

from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecommendedAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[RecommendedAction]
    COMPONENT_RESET: _ClassVar[RecommendedAction]
    CONTACT_SUPPORT: _ClassVar[RecommendedAction]
    RESTART_BM: _ClassVar[RecommendedAction]
    RESTART_APP: _ClassVar[RecommendedAction]
    UNKNOWN: _ClassVar[RecommendedAction]

class ProcessingStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNSPECIFIED: _ClassVar[ProcessingStrategy]
    EXECUTE_REMEDIATION: _ClassVar[ProcessingStrategy]
    STORE_ONLY: _ClassVar[ProcessingStrategy]
NONE: RecommendedAction
COMPONENT_RESET: RecommendedAction
CONTACT_SUPPORT: RecommendedAction
RESTART_BM: RecommendedAction
RESTART_APP: RecommendedAction
UNKNOWN: RecommendedAction
UNSPECIFIED: ProcessingStrategy
EXECUTE_REMEDIATION: ProcessingStrategy
STORE_ONLY: ProcessingStrategy

class HealthEvents(_message.Message):
    __slots__ = ("version", "events")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    events: _containers.RepeatedCompositeFieldContainer[HealthEvent]
    def __init__(self, version: _Optional[int] = ..., events: _Optional[_Iterable[_Union[HealthEvent, _Mapping]]] = ...) -> None: ...

class HealthEvent(_message.Message):
    __slots__ = ("version", "agent", "componentClass", "checkName", "isFatal", "isHealthy", "message", "recommendedAction", "entitiesImpacted", "metadata", "generatedTimestamp", "nodeName", "processingStrategy")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    COMPONENTCLASS_FIELD_NUMBER: _ClassVar[int]
    CHECKNAME_FIELD_NUMBER: _ClassVar[int]
    ISFATAL_FIELD_NUMBER: _ClassVar[int]
    ISHEALTHY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDEDACTION_FIELD_NUMBER: _ClassVar[int]
    ENTITIESIMPACTED_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    GENERATEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    NODENAME_FIELD_NUMBER: _ClassVar[int]
    PROCESSINGSTRATEGY_FIELD_NUMBER: _ClassVar[int]
    version: int
    agent: str
    componentClass: str
    checkName: str
    isFatal: bool
    isHealthy: bool
    message: str
    recommendedAction: RecommendedAction
    entitiesImpacted: _containers.RepeatedCompositeFieldContainer[Entity]
    metadata: _containers.ScalarMap[str, str]
    generatedTimestamp: _timestamp_pb2.Timestamp
    nodeName: str
    processingStrategy: ProcessingStrategy
    def __init__(self, version: _Optional[int] = ..., agent: _Optional[str] = ..., componentClass: _Optional[str] = ..., checkName: _Optional[str] = ..., isFatal: _Optional[bool] = ..., isHealthy: _Optional[bool] = ..., message: _Optional[str] = ..., recommendedAction: _Optional[_Union[RecommendedAction, str]] = ..., entitiesImpacted: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., generatedTimestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nodeName: _Optional[str] = ..., processingStrategy: _Optional[_Union[ProcessingStrategy, str]] = ...) -> None: ...

class Entity(_message.Message):
    __slots__ = ("entityType", "entityValue")
    ENTITYTYPE_FIELD_NUMBER: _ClassVar[int]
    ENTITYVALUE_FIELD_NUMBER: _ClassVar[int]
    entityType: str
    entityValue: str
    def __init__(self, entityType: _Optional[str] = ..., entityValue: _Optional[str] = ...) -> None: ...
