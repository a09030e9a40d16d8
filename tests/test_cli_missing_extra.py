"""Every CLI command that opens a store, given ``--db postgresql://...`` without the
``postgres`` extra, says so in one line (issue 31): no traceback.

The processes run with psycopg made unimportable (a ``sitecustomize`` that blocks it),
as on a machine where only the ``cli`` extra was installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proving_support import process_env

URL = "postgresql://nobody@127.0.0.1:1/none"

COMMANDS: dict[str, list[str]] = {
    "receipts-list": ["receipts", "list"],
    "receipts-resolve": [
        "receipts",
        "resolve",
        "t",
        "a.b:k",
        "--applied",
        "--value",
        "null",
        "--note",
        "n",
    ],
    "check": ["check", "--agent", "host_support:billing_agent"],
    "migrate": ["migrate"],
    "prune": ["prune", "--older-than", "30d"],
    "outbox-status": ["outbox", "status"],
    "outbox-relay": ["outbox", "relay", "--to", "nats://127.0.0.1:1"],
    "interactions-expire": ["interactions", "expire"],
    "interactions-list": ["interactions", "list"],
    "threads-show": ["threads", "show", "t"],
    "serve": ["serve", "--agent", "host_support:billing_agent", "--port", "1"],
}


@pytest.fixture(scope="module")
def without_psycopg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("no-psycopg")
    (site / "sitecustomize.py").write_text(
        "import sys\nfor name in ('psycopg', 'psycopg_pool'):\n    sys.modules[name] = None\n"
    )
    return site


@pytest.mark.parametrize("command", COMMANDS)
def test_a_postgres_url_without_the_extra_is_one_line_naming_it(
    without_psycopg: Path, command: str, tmp_path: Path
) -> None:
    env = process_env(HOST_TEST_PROVIDER_DB=str(tmp_path / "provider.db"))
    env["PYTHONPATH"] = f"{without_psycopg}:{env['PYTHONPATH']}"
    done = subprocess.run(
        [sys.executable, "-m", "intention_kernel", *COMMANDS[command], "--db", URL],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "pip install 'intention-kernel[postgres]'" in line, line
