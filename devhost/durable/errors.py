"""Errors the devhost Durable backend raises to its callers (the HTTP API maps each one to a status code)."""


class DurableError(Exception):
    """Base class of every error the durable engine reports to a caller."""


class InvalidInstanceId(DurableError, ValueError):
    """The instance id breaks the Durable Functions instance-id rules (HTTP 400)."""


class OrchestratorNotFound(DurableError, ValueError):
    """No orchestrator function of that name is registered (HTTP 400, as the extension answers)."""


class InstanceAlreadyExists(DurableError):
    """start_new on an id whose instance is Pending, Running, ContinuedAsNew or Suspended
    (OrchestrationAlreadyExistsException; the HTTP API answers 500, as the extension does: see docs/devhost.md).
    """


class InstanceNotFound(DurableError, KeyError):
    """No instance with that id (HTTP 404)."""


class InstanceGone(DurableError):
    """The instance is Completed, Failed or Terminated (HTTP 410)."""


class InstanceNotTerminal(DurableError):
    """Purge of an instance that is still Pending or Running (HTTP 412)."""


class NotSupported(DurableError):
    """A Durable Functions feature devhost does not implement (durable entities, call_http, suspend...)."""


ENTITIES_NOT_SUPPORTED = (
    "Durable entities are not supported by devhost: run the app under `func start` "
    "(Azure Functions Core Tools) to use entity functions."
)
