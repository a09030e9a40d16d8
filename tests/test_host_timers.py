"""The HTTP host fires due timers in the background (its lifespan), unless told not to."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from starlette.testclient import TestClient

from intention_kernel import Kernel
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.host import create_app
from timer_worker import jobs_agent


def seed(path: Path) -> None:
    async def go() -> None:
        async with SQLiteDurability(path) as store:
            kernel = Kernel(jobs_agent(), store)
            await kernel.schedule("t", "due", at=datetime.now(UTC) - timedelta(seconds=1))

    asyncio.run(go())


def status(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return str(conn.execute("SELECT status FROM ik_timers").fetchone()[0])


def test_the_host_fires_due_timers_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    seed(path)
    app = create_app(Kernel(jobs_agent(), SQLiteDurability(path)), timer_poll=0.02)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        deadline = time.monotonic() + 20
        while status(path) != "fired":
            assert time.monotonic() < deadline, "the host fired nothing"
            time.sleep(0.02)
        assert client.get("/healthz").status_code == 200


def test_a_host_told_not_to_fires_no_timer(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    seed(path)
    app = create_app(Kernel(jobs_agent(), SQLiteDurability(path)), timers=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(0.3)
    assert status(path) == "pending"
