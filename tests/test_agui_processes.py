"""An AG-UI run whose serving process dies, retried on a new process: one charge.

``intention-kernel serve`` runs in a real process on SQLite and on PostgreSQL. A
first process opens the confirmation; a second dies (``os._exit``) at a durable
point of the run that accepts it; a third gets the same run again. The client saw
no ``RUN_FINISHED`` from the dead one, the retry finishes the run, and the
provider's own ledger (a file) holds exactly one charge.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agui_support import DIE_AT_ENV
from host_support import served, store_url_for
from intention_kernel.testing import faults

pytestmark = pytest.mark.slow

AGENT = "agui_support:dying_billing_agent"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url_for(request, tmp_path, "ik_agui")


def post_run(base_url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events received for one run, however the connection ended."""
    events: list[dict[str, Any]] = []
    try:
        with httpx.stream("POST", f"{base_url}/v1/agui", json=body, timeout=30) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
    except httpx.TransportError:
        pass  # the process died: what arrived before is all there is
    return events


def charges(provider: Path) -> int:
    with sqlite3.connect(provider) as db:
        count: int = db.execute("SELECT COUNT(*) FROM demo_provider_calls").fetchone()[0]
    return count


@pytest.mark.parametrize(
    "point", [faults.AFTER_RECEIPT_COMPLETED, faults.BEFORE_COMMIT, faults.AFTER_COMMIT]
)
def test_a_run_whose_process_died_is_retried_elsewhere_and_charges_once(
    store_url: str, tmp_path: Path, point: str
) -> None:
    provider = tmp_path / "provider.db"
    said = {"id": "m1", "role": "user", "content": "pay invoice 42"}
    with served(store_url, provider=provider, agent=AGENT) as base_url:
        opened = post_run(base_url, {"threadId": "acct", "runId": "r1", "messages": [said]})
    [interrupt] = opened[-1]["outcome"]["interrupts"]
    answer = {"interruptId": interrupt["id"], "status": "resolved", "payload": "accept"}
    body = {"threadId": "acct", "runId": "r2", "messages": [said], "resume": [answer]}

    with served(store_url, provider=provider, agent=AGENT, env={DIE_AT_ENV: point}) as base_url:
        cut = post_run(base_url, body)
    assert "RUN_FINISHED" not in [event["type"] for event in cut]
    assert charges(provider) == 1

    with served(store_url, provider=provider, agent=AGENT) as base_url:
        retried = post_run(base_url, body)
        again = post_run(base_url, body)
    finished = retried[-1]
    assert (finished["type"], finished["outcome"]["type"]) == ("RUN_FINISHED", "success")
    [step] = finished["result"]["steps"]
    assert (step["capability_id"], step["status"]) == ("payments.charge", "completed")
    assert again[-1]["result"] == {**finished["result"], "replayed": True}
    assert charges(provider) == 1
