"""A Flask app over one ``SyncKernel``, served by gunicorn in ``test_sync_processes.py``.

The environment names the store (``SYNC_APP_DB``, a URL) and a ledger file
(``SYNC_APP_LEDGER``): each write appends one line there (``O_APPEND``), from whichever
worker process runs it, so the test counts real writes across processes.

The kernel is built at import. With ``gunicorn --preload`` that is in the master,
which also reads a checkpoint, so its loop runs before the workers fork: each worker
then opens the store anew from the URL, as the kernel does after a fork.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify, request

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Intent,
    Interpretation,
    InterpretationRequest,
    KernelError,
    SyncKernel,
    TurnConflictError,
    capability,
)
from intention_kernel.testing import ScriptedInterpreter

LEDGER = os.environ["SYNC_APP_LEDGER"]


def append_to_ledger(thread_id: str, authority: EffectAuthority) -> dict[str, Any]:
    """The write: one line in the ledger, from a sync function (it runs in a thread)."""
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{thread_id}/{authority.key} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return {"key": authority.key, "pid": os.getpid()}


@capability("ledger.write", effect="write", confirmation="capability")
async def write(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
    """A write that needs no consent: one ledger line per turn."""
    thread_id = ctx.thread_id
    effect = await ctx.run_effect(
        f"line:{ctx.turn_id}", lambda authority: append_to_ledger(thread_id, authority)
    )
    return CapabilityResult(value=effect.value, reply=f"wrote {input['text']}")


def interpret(request: InterpretationRequest) -> Interpretation:
    return Interpretation(intents=[Intent("ledger.write", {"text": request.message})])


agent = Agent(
    name="ledger",
    version="1",
    capabilities=[write],
    interpreter=ScriptedInterpreter(interpret),
)
kernel = SyncKernel(agent, os.environ["SYNC_APP_DB"])
kernel.checkpoint("warm-up")  # the loop runs in the process that imports the app

app = Flask(__name__)


@app.get("/health")
def health() -> Any:
    return jsonify({"pid": os.getpid()})


@app.post("/threads/<thread_id>/turns/<turn_id>")
def turn(thread_id: str, turn_id: str) -> Any:
    body = request.get_json()
    try:
        result = kernel.turn(thread_id, turn_id, body["message"])
    except TurnConflictError as error:
        return jsonify({"error": type(error).__name__}), 409
    except KernelError as error:
        return jsonify({"error": type(error).__name__, "message": str(error)}), 500
    return jsonify({"result": result.to_dict(), "pid": os.getpid()})
