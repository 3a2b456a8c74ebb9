"""Durable Functions backend of devhost: SQLite history, replay through the real SDK, the extension's HTTP
API.
"""

from ._dispatch import utcnow
from .binding import WEBHOOK_PREFIX
from .engine import DurableEngine
from .errors import (
    DurableError,
    InstanceAlreadyExists,
    InstanceGone,
    InstanceNotFound,
    InstanceNotTerminal,
    InvalidInstanceId,
    NotSupported,
    OrchestratorNotFound,
)
from .ids import validate_instance_id
from .versioning import VersioningPolicy, compare_versions, versioning_policy

__all__ = [
    "WEBHOOK_PREFIX",
    "DurableEngine",
    "DurableError",
    "InstanceAlreadyExists",
    "InstanceGone",
    "InstanceNotFound",
    "InstanceNotTerminal",
    "InvalidInstanceId",
    "NotSupported",
    "OrchestratorNotFound",
    "VersioningPolicy",
    "compare_versions",
    "utcnow",
    "validate_instance_id",
    "versioning_policy",
]
