"""``intention-kernel serve --agent`` with an agent that needs async set-up (issue 31).

An MCP client, or an interpreter to close, is opened on an event loop and must be
closed. ``serve`` accepts an async factory or an async context manager: it enters it
on the loop that serves, before the host starts, and exits it on shutdown. Real
``serve`` processes, stopped with SIGINT as an operator stops them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from async_agents_support import LOG_ENV
from host_support import PROVIDER_ENV, served
from proving_support import process_env


@pytest.mark.parametrize(
    "agent", ["async_agents_support:managed_agent", "async_agents_support:MANAGED"]
)
def test_an_async_context_manager_is_entered_before_serving_and_exited_on_shutdown(
    tmp_path: Path, agent: str
) -> None:
    log = tmp_path / "agent.log"
    with served(tmp_path / "store.db", agent=agent, env={LOG_ENV: str(log)}) as base_url:
        [entered] = log.read_text().splitlines()
        assert entered.startswith("entered ")
        turn = httpx.post(
            f"{base_url}/v1/threads/t/turns",
            json={"turn_id": "1", "message": "what is my balance?"},
            timeout=30,
        )
        assert turn.status_code == 200, turn.text
        assert log.read_text().splitlines() == [entered]
    assert log.read_text().splitlines() == [entered, "exited"]


def test_an_async_factory_is_awaited_before_serving(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    with served(
        tmp_path / "store.db", agent="async_agents_support:async_factory", env={LOG_ENV: str(log)}
    ) as base_url:
        [built] = log.read_text().splitlines()
        assert built.startswith("built ")
        turn = httpx.post(
            f"{base_url}/v1/threads/t/turns",
            json={"turn_id": "1", "message": "what is my balance?"},
            timeout=30,
        )
        assert turn.status_code == 200, turn.text


def test_set_up_that_fails_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "intention_kernel",
            "serve",
            "--agent",
            "async_agents_support:failing_agent",
            "--db",
            f"sqlite:///{tmp_path / 'store.db'}",
            "--port",
            "0",
        ],
        env=process_env(**{PROVIDER_ENV: str(tmp_path / "provider.db"), LOG_ENV: "unused"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "failing_agent failed to enter" in line and "refused the connection" in line
    assert not (tmp_path / "store.db").exists()  # refused before a store was opened


def test_check_enters_an_async_agent_too(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    store = tmp_path / "store.db"
    with served(store, agent="async_agents_support:managed_agent", env={LOG_ENV: str(log)}) as url:
        httpx.post(f"{url}/v1/threads/t/turns", json={"turn_id": "1", "message": "hi"}, timeout=30)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "intention_kernel",
            "check",
            "--agent",
            "async_agents_support:managed_agent",
            "--db",
            f"sqlite:///{store}",
        ],
        env=process_env(**{PROVIDER_ENV: str(store), LOG_ENV: str(log)}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().splitlines()[-2:][1] == "exited"
    assert len([line for line in log.read_text().splitlines() if line == "exited"]) == 2
