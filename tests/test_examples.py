"""The examples run in one command against SQLite and PostgreSQL, rules or a model.

Each example is run as a user would run it (``python -m examples.<name>`` from the
repository root, in a subprocess), twice on the same store and thread: the first
run commits the conversation and calls the fake provider once per operation; the
second replays every turn and calls nothing. With ``--llm`` the interpretation
comes from recorded model responses served by the local OpenAI-compatible stub.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from openai_stub import OpenAIStub, running_stub

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.{name}", *args],
        cwd=ROOT,
        env={**clean, "PYTHONIOENCODING": "utf-8", **(env or {})},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def summary(output: str) -> dict[str, int]:
    line = next(line for line in output.splitlines() if line.startswith("summary: "))
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def provider(output: str) -> dict[str, int]:
    """``provider: <operation> charged|booked <n>x`` lines."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^provider: (\S+) \w+ (\d+)x$", output, re.M)}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """``--db`` and ``--thread`` arguments: a temporary SQLite file, or the test
    PostgreSQL database with a schema of its own (named in the URL, dropped afterwards),
    so that runs never collide, nor meet a schema another library version migrated."""
    thread = f"example-{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        yield ["--db", f"sqlite:///{tmp_path / 'example.db'}", "--thread", thread]
        return
    import psycopg
    from psycopg import sql

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"ik_test_{uuid.uuid4().hex[:12]}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    try:
        yield ["--db", url, "--thread", thread]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with running_stub() as server:
        yield server
    assert server.unexpected == 0, "the example called the model more often than recorded"


def llm_env(stub: OpenAIStub) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "gpt-4o-mini"}


# -- billing: confirmation="required" ------------------------------------------------------


def check_billing(output: str) -> None:
    assert summary(output) == {
        "committed": 6,
        "replayed": 1,
        "failed_steps": 0,
        "provider_calls": 1,
    }
    assert provider(output) == {"pi_acme_42": 1}
    # The confirmation asked before the restart is still pending after it.
    assert "[turn-3] waiting for an answer: Charge $125.00 to Acme Corp for invoice 42?" in output
    assert "[turn-4] agent: Charged $125.00 for invoice 42 (charge ch_0001)." in output
    assert "[turn-4] replayed: the stored result came back; nothing ran" in output
    assert "[turn-6] agent: Invoice 42 was already charged in turn-4" in output


def test_billing_example_charges_once_and_replays_on_a_rerun(store: list[str]) -> None:
    first = run_example("billing", *store)
    check_billing(first)

    again = run_example("billing", *store)
    assert summary(again) == {
        "committed": 0,
        "replayed": 7,
        "failed_steps": 0,
        "provider_calls": 0,
    }


def test_billing_example_with_a_model(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.queue(
        "balance_42",
        "example_billing_charge_42",
        "balance_43",
        "answer_accept",
        "example_billing_charge_42",
        "answer_accept",
    )
    output = run_example(
        "billing", "--db", f"sqlite:///{tmp_path / 'b.db'}", "--llm", env=llm_env(stub)
    )
    assert "interpreter: OpenAIInterpreter" in output
    check_billing(output)
    assert stub.pending == 0
    offered = [t["function"]["name"] for t in stub.requests[0]["tools"]]
    assert offered == ["billing__balance", "payments__charge"]


# -- travel: confirmation="capability" -----------------------------------------------------


def check_travel(output: str) -> None:
    assert summary(output) == {
        "committed": 6,
        "replayed": 1,
        "failed_steps": 0,
        "provider_calls": 2,
    }
    assert provider(output) == {"FR8412": 1, "TP538": 1}
    # Under the policy's limit: booked in the proposing turn, without a question.
    assert "[turn-2] agent: Booked FR8412 for Ada Lovelace at €79.00" in output
    assert "[turn-3] step travel.book: awaiting_confirmation" in output
    # The fare moved while the person thought: the acceptance books nothing.
    assert "[turn-4] agent: The fare changed from €189.00 to €209.00 since you were asked" in output
    assert "[turn-6] agent: Booked TP538 for Ada Lovelace at €209.00" in output
    assert "[turn-6] replayed: the stored result came back; nothing ran" in output


def test_travel_example_books_once_and_replays_on_a_rerun(store: list[str]) -> None:
    first = run_example("travel", *store)
    check_travel(first)

    again = run_example("travel", *store)
    assert summary(again) == {
        "committed": 0,
        "replayed": 7,
        "failed_steps": 0,
        "provider_calls": 0,
    }


def test_travel_example_with_a_model(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.queue(
        "example_travel_search",
        "example_travel_book_fr8412",
        "example_travel_book_tp538",
        "answer_accept",
        "example_travel_book_tp538",
        "answer_accept",
    )
    output = run_example(
        "travel", "--db", f"sqlite:///{tmp_path / 't.db'}", "--llm", env=llm_env(stub)
    )
    check_travel(output)
    assert stub.pending == 0
    # The answer tools were offered exactly while the booking waited for consent.
    offered = [[t["function"]["name"] for t in r["tools"]] for r in stub.requests]
    assert ["answer_accept" in names for names in offered] == [
        False,
        False,
        False,
        True,
        False,
        True,
    ]


def test_llm_mode_without_a_model_name_says_what_to_set(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.billing",
            "--db",
            f"sqlite:///{tmp_path / 'x.db'}",
            "--llm",
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "OPENAI_MODEL" in proc.stderr


def test_the_quickstart_asks_charges_once_and_replays_when_run_again(tmp_path: Path) -> None:
    """``python examples/quickstart.py URL``, as the README shows it, from another
    directory: the charge waits for "yes", runs once, and a second run replays both
    deliveries without calling the provider."""
    url = f"sqlite:///{tmp_path / 'quickstart.db'}"

    def run() -> list[str]:
        return run_script("quickstart.py", url, tmp_path)

    assert run() == [
        "delivery-1: Charge 12500 cents to pi_42? Reply yes or no. (replayed=False)",
        "delivery-2: Charged 125.00 (charge ch_pi_42). (replayed=False)",
        "provider calls in this run: 1",
    ]
    assert run() == [
        "delivery-1: Charge 12500 cents to pi_42? Reply yes or no. (replayed=True)",
        "delivery-2: Charged 125.00 (charge ch_pi_42). (replayed=True)",
        "provider calls in this run: 0",
    ]


@pytest.mark.slow
def test_the_built_wheel_installs_into_a_fresh_venv_and_imports(tmp_path: Path) -> None:
    """``python -m build`` makes a wheel that installs on its own, as the README says
    (its dependencies come from the registry), with the console script."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        check=True,
        timeout=600,
    )
    (wheel,) = dist.glob("intention_kernel-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"{wheel}[cli]"],
        capture_output=True,
        check=True,
        timeout=600,
    )
    probe = (
        "import intention_kernel, intention_kernel.durability.sqlite, intention_kernel.cli._app; "
        "print(intention_kernel.__version__, intention_kernel.__file__)"
    )
    shown = subprocess.run(
        [str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    assert shown[0] == wheel.name.split("-")[1]
    assert Path(shown[1]).is_relative_to(venv), "imported from the checkout, not the wheel"
    version = subprocess.run(
        [str(venv / "bin" / "intention-kernel"), "--version"], capture_output=True, text=True
    )
    assert version.stdout.strip() == f"intention-kernel {shown[0]}", version
    # The quick start runs against the installed wheel too.
    quick = subprocess.run(
        [str(python), str(ROOT / "examples" / "quickstart.py"), f"sqlite:///{tmp_path}/q.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert quick.returncode == 0 and "provider calls in this run: 1" in quick.stdout, quick


def test_the_readmes_first_code_block_is_the_quickstart_verbatim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"```python\n(.*?)```", readme, re.S)
    assert first is not None
    source = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    block = first.group(1)
    assert block.startswith("import asyncio\n") and source.endswith(block)


def test_the_agent_loop_example_reads_then_holds_the_charge_in_one_turn(tmp_path: Path) -> None:
    """``python examples/agent_loop.py URL``: one turn of three rounds (a read, a charge
    held for confirmation, the reply), then "yes" charges once; a second run replays."""
    url = f"sqlite:///{tmp_path / 'loop.db'}"

    def run() -> list[str]:
        return run_script("agent_loop.py", url, tmp_path)

    first = run()
    assert first == [
        "delivery-1: Invoice 42 owes 12500 cents, under $200: I will pay it once you confirm.",
        "Charge 12500 cents for invoice 42? Reply yes or no.",
        "  step billing.balance: completed",
        "  step payments.charge: awaiting_confirmation",
        "delivery-2: Paid invoice 42. (replayed=False)",
        "provider calls in this run: 1",
    ]
    again = run()
    assert again[-2:] == [
        "delivery-2: Paid invoice 42. (replayed=True)",
        "provider calls in this run: 0",
    ]


def run_script(script: str, url: str, cwd: Path) -> list[str]:
    """``python examples/<script> URL`` from ``cwd``: its output lines (it must succeed)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), url],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()
