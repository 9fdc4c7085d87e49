"""The class path earlier versions of rl-verify stored for a deferred training task
(``rl_verify.triggers.RLJobTrigger``): kept importable so that a task deferred before an upgrade
resumes after it. The trigger lives in ``rl_verify.orchestration.triggers``."""

from rl_verify.orchestration.triggers import RLJobTrigger

__all__ = ["RLJobTrigger"]
