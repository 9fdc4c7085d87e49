"""The trigger a bisection waits on while its probe runs train (``probes.BisectOperator`` defers to it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class ProbesTrigger(BaseTrigger):
    """Waits until one of a bisection's probe runs (DAG runs of ``dag_id``) has ended, then reports the
    states of every one of ``run_ids`` that has. It asks Airflow for the runs' states the way the
    standard provider's ``DagStateTrigger`` does (the Task SDK's ``RuntimeTaskInstance.get_dagrun_state``),
    so it needs no API credentials."""

    def __init__(self, *, dag_id: str, run_ids: list[str], poll_interval: float = 10) -> None:
        super().__init__()
        self.dag_id, self.run_ids, self.poll_interval = dag_id, list(run_ids), float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("rl_verify.orchestration.probe_trigger.ProbesTrigger",
                {"dag_id": self.dag_id, "run_ids": self.run_ids, "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        state_of = sync_to_async(RuntimeTaskInstance.get_dagrun_state)
        while True:
            ended: dict[str, str] = {}
            for run_id in self.run_ids:
                state = str(getattr(s := await state_of(dag_id=self.dag_id, run_id=run_id), "value", s))
                if state in ("success", "failed"):
                    ended[run_id] = state
            if ended or not self.run_ids:
                yield TriggerEvent({"ended": ended})
                return
            await asyncio.sleep(self.poll_interval)
