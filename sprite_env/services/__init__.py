"""Services: long-running programs of the environment, defined inside the layer.

Concepts:

- A **definition** is ``ROOT/etc/sprite/services/NAME.toml`` (format in
  ``definitions.py``). It lives in the layer, so a checkpoint carries its services and a
  restore brings back the ones defined at that checkpoint.
- The :class:`Supervisor` runs each service in its own process group, restarts it by its
  policy with exponential backoff, ends the whole group on stop (stop signal, timeout,
  SIGKILL), and keeps its output in a rotated log outside the layer.
- Processes started by hand are not services: on a restore, :func:`processes_using` finds
  whatever still holds the tree and :func:`terminate` ends it; nothing brings them back.

Invariants: a service's processes never outlive a stop or the supervisor (except one that
left its process group); a bad definition file never keeps the others from loading.
"""

from sprite_env.services.definitions import (
    DEFINITIONS_DIR,
    DefinitionError,
    InvalidServiceName,
    ServiceDef,
    UnknownService,
    load_definition,
    load_definitions,
    parse_definition,
    validate_name,
)
from sprite_env.services.processes import (
    ProcInfo,
    TerminateReport,
    process_ids,
    processes_using,
    terminate,
)
from sprite_env.services.supervisor import (
    Backoff,
    ServicesPaused,
    Supervisor,
    SupervisorNotRunning,
)

__all__ = [
    "DEFINITIONS_DIR",
    "Backoff",
    "DefinitionError",
    "InvalidServiceName",
    "ProcInfo",
    "ServiceDef",
    "ServicesPaused",
    "Supervisor",
    "SupervisorNotRunning",
    "TerminateReport",
    "UnknownService",
    "load_definition",
    "load_definitions",
    "parse_definition",
    "process_ids",
    "processes_using",
    "terminate",
    "validate_name",
]
