"""One writer of the two-writers test (tests/test_langgraph_saver.py), in its own process.

Run as ``python tests/langgraph_saver_worker.py '<json config>'``: ``url`` (the store),
``thread_id``, ``writer`` (its name, which LangGraph copies into each checkpoint's
metadata), ``start`` (the graph's input number, or None to resume the thread with
``invoke(None)``), ``barrier`` (``{"dir", "count"}``, optional) and ``die_in`` (a
node's name, optional: the process sends itself SIGKILL when that node starts).
The worker drives a sync graph through a KernelSaver. Before its first put it waits
until ``count`` workers got there too, so that every worker read the thread before any
wrote it. It prints one JSON line: ``{"outcome": "done", "n"}`` or ``{"outcome":
"refused", "error"}`` (the error's class name).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.graph import END, START, StateGraph

from intention_kernel.integrations.langgraph import CheckpointConflictError, KernelSaver


class Count(TypedDict):
    n: int
    seen: list[str]


class GatedSaver(KernelSaver):
    """A KernelSaver whose first put waits for the other workers at the barrier."""

    def __init__(self, url: str, barrier: dict[str, Any] | None) -> None:
        super().__init__(url)
        self.barrier: dict[str, Any] | None = barrier

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        if self.barrier is not None:
            meet(self.barrier)
            self.barrier = None
        return super().put(config, checkpoint, metadata, new_versions)


def meet(barrier: dict[str, Any]) -> None:
    folder = Path(barrier["dir"])
    folder.joinpath(str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < barrier["count"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the other workers never came")
        time.sleep(0.01)


def graph(saver: KernelSaver, die_in: str | None = None) -> Any:
    def step(name: str) -> Any:
        def run(state: Count) -> dict[str, Any]:
            if name == die_in:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.05)  # room for the other writer to interleave, if it could
            return {"n": state["n"] + 1, "seen": [*state["seen"], name]}

        return run

    builder = StateGraph(Count)
    names = ["one", "two", "three"]
    for name in names:
        builder.add_node(name, step(name))
    builder.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=saver)


def main(config: dict[str, Any]) -> None:
    with GatedSaver(config["url"], config.get("barrier")) as saver:
        run: RunnableConfig = {
            "configurable": {"thread_id": config["thread_id"], "writer": config["writer"]}
        }
        start = config["start"]
        given = None if start is None else {"n": start, "seen": [config["writer"]]}
        try:
            result = graph(saver, config.get("die_in")).invoke(given, run, durability="sync")
        except CheckpointConflictError as refused:
            print(json.dumps({"outcome": "refused", "error": type(refused).__name__}))
            return
        print(json.dumps({"outcome": "done", "n": result["n"]}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
