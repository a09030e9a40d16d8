"""The examples run in one command against SQLite and PostgreSQL, rules or a model.

Each example is run as a user would run it (``python -m examples.<name>`` from the
repository root, in a subprocess), twice on the same store and thread: the first
run commits the conversation and calls the fake provider once per operation; the
second replays every turn and calls nothing. With ``--llm`` the model works in
rounds: billing's is the transcript that ``examples/scripted_chat.py`` plays, as the
README runs it offline; travel's, recorded responses served by ``openai_stub``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.scripted_chat import ScriptedChat, serve

from openai_stub import OpenAIStub, completion, recording, running_stub

ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPT = ROOT / "examples" / "billing" / "transcript.json"


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


def scripted_env(chat: ScriptedChat) -> dict[str, str]:
    return {"OPENAI_BASE_URL": chat.base_url, "OPENAI_MODEL": "scripted"}


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


def turn_requests(chat: ScriptedChat, message: str) -> list[dict[str, Any]]:
    """The requests of the turns whose last user message is ``message``, in order."""
    return [
        r
        for r in chat.requests
        if [m["content"] for m in r["messages"] if m["role"] == "user"][-1] == message
    ]


def tool_results(request: dict[str, Any]) -> dict[str, Any]:
    """``tool_call_id`` → the outcome a ``role: "tool"`` message carries (JSON)."""
    return {
        m["tool_call_id"]: json.loads(m["content"])
        for m in request["messages"]
        if m["role"] == "tool"
    }


def test_billing_example_with_a_model_works_in_rounds(store: list[str]) -> None:
    """``--llm`` against ``examples/scripted_chat.py`` playing the billing transcript, as
    the README runs it offline: "please pay invoice 42" is one turn of three rounds (the
    balance, the charge held for confirmation, the model's text as the reply)."""
    with serve(TRANSCRIPT) as chat:
        output = run_example("billing", *store, "--llm", env=scripted_env(chat))
        pay = turn_requests(chat, "please pay invoice 42")
        assert len(pay) == 3
        # Round 2 carries round 1's read as a tool message, right after the call.
        [read] = [m for m in pay[1]["messages"] if m["role"] == "assistant" and "tool_calls" in m]
        [call] = read["tool_calls"]
        assert call["function"]["name"] == "billing__balance"
        assert tool_results(pay[1]) == {
            call["id"]: {
                "status": "completed",
                "value": {"invoice_id": "42", "amount_due_cents": 12500},
            }
        }
        messages = pay[1]["messages"]
        assert messages[messages.index(read) + 1]["tool_call_id"] == call["id"]
        # Round 3 hears that the charge waits for the person.
        held = list(tool_results(pay[2]).values())[-1]
        assert held["status"] == "awaiting_confirmation"
        assert len(chat.requests) == 13  # 2 + 3 + 2 + 2 (+ the replay: none) + 2 + 2

        again = run_example("billing", *store, "--llm", env=scripted_env(chat))
        assert len(chat.requests) == 13  # every turn replayed: the model is asked nothing
    assert summary(again)["replayed"] == 7

    assert "interpreter: OpenAIInterpreter" in output
    assert summary(output) == {
        "committed": 6,
        "replayed": 1,
        "failed_steps": 0,
        "provider_calls": 1,
    }
    assert provider(output) == {"pi_acme_42": 1}
    turn_2 = [line for line in output.splitlines() if line.startswith("[turn-2] ")]
    assert turn_2 == [
        "[turn-2] you: please pay invoice 42",
        # the model's final text is the reply, the prompt it must be confirmed by after it
        "[turn-2] agent: Invoice 42 has $125.00 due; I will charge it once you confirm.",
        "[turn-2] agent: Charge $125.00 to Acme Corp for invoice 42? Reply yes or no.",
        "[turn-2] step billing.balance: completed",
        "[turn-2] step payments.charge: awaiting_confirmation",
    ]
    # Still held across the restart, and charged once on "yes".
    assert "[turn-3] waiting for an answer: Charge $125.00 to Acme Corp for invoice 42?" in output
    assert "[turn-4] agent: Done: $125.00 charged for invoice 42 (charge ch_0001)." in output
    assert "[turn-4] step payments.charge: completed" in output
    # The second "yes" of the conversation gets the transcript's second "yes" turn.
    assert "[turn-6] agent: Invoice 42 is paid (charge ch_0001)." in output


def test_the_scripted_chat_server_streams_the_same_answer() -> None:
    """``"stream": true`` gets the transcript's round as ``chat.completion.chunk``
    events, which the official client reads back into the same text and tool call."""
    import openai

    with serve(TRANSCRIPT) as chat:
        client = openai.OpenAI(base_url=chat.base_url, api_key="unused", max_retries=0)
        ask: list[Any] = [{"role": "user", "content": "what do I owe on invoice 42?"}]
        events = list(client.chat.completions.create(model="m", messages=ask, stream=True))
        [opened] = [e for e in events if e.choices and e.choices[0].delta.tool_calls]
        [call] = opened.choices[0].delta.tool_calls or []
        assert call.function is not None and call.function.name == "billing__balance"
        assert json.loads(call.function.arguments or "") == {"invoice_id": "42"}
        assert events[-1].choices[0].finish_reason == "tool_calls"

        ask += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "{}"},
        ]
        events = list(client.chat.completions.create(model="m", messages=ask, stream=True))
        text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
        assert text == "Invoice 42 (Acme Corp) has $125.00 due."
        # A round the transcript does not have is refused, and says which it was.
        ask += [{"role": "assistant", "content": text}]
        with pytest.raises(openai.BadRequestError, match="round 3 was asked for"):
            client.chat.completions.create(model="m", messages=ask)
        client.close()


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
    """Each turn is two rounds: the recorded tool call, then a completion with no text,
    so the reply is the kernel's own account of the steps (the capabilities' replies)."""
    calls = [
        "example_travel_search",
        "example_travel_book_fr8412",
        "example_travel_book_tp538",
        "answer_accept",
        "example_travel_book_tp538",
        "answer_accept",
    ]
    stub.queue_data(r for name in calls for r in (recording(name), completion(None)))
    output = run_example(
        "travel", "--db", f"sqlite:///{tmp_path / 't.db'}", "--llm", env=llm_env(stub)
    )
    check_travel(output)
    assert stub.pending == 0
    # Round 2 of each turn hears its tool call's outcome.
    assert [m["role"] for m in stub.requests[1]["messages"][-2:]] == ["assistant", "tool"]
    # The answer tools were offered exactly while the booking waited for consent, and
    # only in the first round of a turn.
    offered = [[t["function"]["name"] for t in r["tools"]] for r in stub.requests]
    assert ["answer_accept" in names for names in offered] == [
        *(False, False),
        *(False, False),
        *(False, False),
        *(True, False),
        *(False, False),
        *(True, False),
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
    """``python examples/quickstart.py URL``, as the quick start shows it, from another
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


def test_the_approvals_example_shows_each_permit_rule_as_its_guide_prints_it(
    tmp_path: Path,
) -> None:
    """``python examples/approvals.py``: a reject's reason, an edit that runs edited, an
    accept after the deadline that runs nothing, a quorum that ignores the same actor
    twice and runs after a second one, and a turn refused while the thread is busy."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "approvals.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout
    guide = (ROOT / "docs" / "guides" / "approvals.md").read_text(encoding="utf-8")
    assert f"```text\n{printed}```" in guide
    assert printed.splitlines()[-1] == "provider calls: ['refund 7 1200', 'payout acme 30000']"
    assert "the step says: rejected by the person: only the lid was broken" in printed
    assert "busy: the thread is running a turn" in printed
    assert list(tmp_path.iterdir()) == []  # its store was a temporary one


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


# -- the Pydantic AI help desk ---------------------------------------------------------------


def test_the_pydantic_ai_desk_writes_once_and_approves_across_a_restart(store: list[str]) -> None:
    """``python -m examples.pydantic_ai_desk``: a Pydantic AI agent whose cancel is
    applied once although its turn is delivered again, and whose refund waits for a
    "yes" across a restart and then runs once; a second run replays every turn."""
    output = run_example("pydantic_ai_desk", *store)
    assert summary(output) == {
        "committed": 4,
        "replayed": 2,
        "failed_steps": 0,
        "provider_calls": 2,
    }
    assert "[turn-3] agent: Refund 1250 cents for order 42? Reply yes, or no and why." in output
    assert '[turn-4] agent: issue_refund for order 42: {"id": "refund_42"}' in output
    assert re.findall(r"^provider: (\S+) applied (\d+)x$", output, re.M) == [
        ("desk.agent:cancel_order:43", "1"),
        ("desk.agent:issue_refund:42", "1"),
    ]
    again = run_example("pydantic_ai_desk", *store)
    assert summary(again) == {
        "committed": 0,
        "replayed": 6,
        "failed_steps": 0,
        "provider_calls": 0,
    }


def test_the_pydantic_ai_desk_killed_mid_turn_calls_the_provider_once(
    store: list[str], tmp_path: Path
) -> None:
    """``python -m examples.pydantic_ai_desk.crash``: a real process dies after the
    cancel's provider call, before its turn commits; the redelivery in a new process
    commits the stored result, the shop was called once and the model asked once per
    request."""
    args = [
        *store,
        "--ledger",
        str(tmp_path / "shop.ledger"),
        "--model-log",
        str(tmp_path / "model.log"),
    ]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    died = subprocess.run(
        [sys.executable, "-m", "examples.pydantic_ai_desk.crash", *args, "--die"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert died.returncode == 137, died.stderr
    assert "summary:" not in died.stdout
    assert len((tmp_path / "shop.ledger").read_text().splitlines()) == 1
    output = run_example("pydantic_ai_desk.crash", *args)
    assert summary(output) == {
        "committed": 1,
        "replayed": 0,
        "failed_steps": 0,
        "provider_calls": 1,
    }
    assert '[crash-1] agent: cancel_order for order 42: {"id": "cancel_42"}' in output
    assert "[crash-1] step desk.agent: completed" in output
    # The request that asked for the cancel was recorded before the cancel ran: the
    # redelivery asked the model only for the one that reads its result.
    assert "model: requests=2 asked=2" in output
    assert (tmp_path / "model.log").read_text().split() == ["1", "3"]


# -- the LangGraph help desk -------------------------------------------------------------------


def test_the_langgraph_desk_writes_once_and_approves_across_a_restart(store: list[str]) -> None:
    """``python -m examples.langgraph_desk``: a LangGraph ReAct agent whose cancel is
    applied once although its turn is delivered again, and whose refund waits for a
    "yes" across a restart and then runs once; a second run replays every turn."""
    output = run_example("langgraph_desk", *store)
    assert summary(output) == {
        "committed": 4,
        "replayed": 2,
        "failed_steps": 0,
        "provider_calls": 2,
    }
    assert "[turn-3] agent: Refund 1250 cents for order 42? Reply yes, or no and why." in output
    assert '[turn-4] agent: issue_refund for order 42: {"id": "refund_42"}' in output
    assert re.findall(r"^provider: (\S+) applied (\d+)x$", output, re.M) == [
        ("desk.agent:cancel_order:43", "1"),
        ("desk.agent:issue_refund:42", "1"),
    ]
    again = run_example("langgraph_desk", *store)
    assert summary(again) == {
        "committed": 0,
        "replayed": 6,
        "failed_steps": 0,
        "provider_calls": 0,
    }


def test_the_langgraph_desk_killed_mid_turn_calls_the_provider_once(
    store: list[str], tmp_path: Path
) -> None:
    """``python -m examples.langgraph_desk.crash``: a real process dies after the
    cancel's provider call, before its turn commits; the redelivery in a new process
    commits the stored result, the shop was called once and the model asked once per
    call."""
    args = [
        *store,
        "--ledger",
        str(tmp_path / "shop.ledger"),
        "--model-log",
        str(tmp_path / "model.log"),
    ]
    died = subprocess.run(
        [sys.executable, "-m", "examples.langgraph_desk.crash", *args, "--die"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert died.returncode == 137, died.stderr
    assert "summary:" not in died.stdout
    assert len((tmp_path / "shop.ledger").read_text().splitlines()) == 1
    output = run_example("langgraph_desk.crash", *args)
    assert summary(output) == {
        "committed": 1,
        "replayed": 0,
        "failed_steps": 0,
        "provider_calls": 1,
    }
    assert '[crash-1] agent: cancel_order for order 42: {"id": "cancel_42"}' in output
    assert "[crash-1] step desk.agent: completed" in output
    # The call that asked for the cancel was recorded before the cancel ran: the
    # redelivery asked the model only for the one that reads its result.
    assert "model: requests=2 asked=2" in output
    assert (tmp_path / "model.log").read_text().split() == ["1", "3"]


# -- the OpenAI Agents SDK help desk -----------------------------------------------------------


def test_the_openai_agents_desk_writes_once_and_approves_across_a_restart(
    store: list[str],
) -> None:
    """``python -m examples.openai_agents_desk``: an Agents SDK agent whose cancel is
    applied once although its turn is delivered again, and whose refund waits for a
    "yes" across a restart (its paused RunState in the checkpoint) and then runs once;
    a second run replays every turn."""
    output = run_example("openai_agents_desk", *store)
    assert summary(output) == {
        "committed": 4,
        "replayed": 2,
        "failed_steps": 0,
        "provider_calls": 2,
    }
    assert "[turn-3] agent: Refund 1250 cents for order 42? Reply yes, or no and why." in output
    assert "[turn-4] agent: issue_refund for order 42: {'id': 'refund_42'}" in output
    assert re.findall(r"^provider: (\S+) applied (\d+)x$", output, re.M) == [
        ("desk.agent:cancel_order:43", "1"),
        ("desk.agent:issue_refund:42", "1"),
    ]
    again = run_example("openai_agents_desk", *store)
    assert summary(again) == {
        "committed": 0,
        "replayed": 6,
        "failed_steps": 0,
        "provider_calls": 0,
    }


def test_the_openai_agents_desk_killed_mid_turn_calls_the_provider_once(
    store: list[str], tmp_path: Path
) -> None:
    """``python -m examples.openai_agents_desk.crash``: a real process is killed
    (SIGKILL) after the cancel's provider call, before its turn commits; the
    redelivery in a new process commits the stored result, and the shop was called
    once."""
    args = [*store, "--ledger", str(tmp_path / "shop.ledger")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    died = subprocess.run(
        [sys.executable, "-m", "examples.openai_agents_desk.crash", *args, "--die"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert "summary:" not in died.stdout
    assert len((tmp_path / "shop.ledger").read_text().splitlines()) == 1
    output = run_example("openai_agents_desk.crash", *args)
    assert summary(output) == {
        "committed": 1,
        "replayed": 0,
        "failed_steps": 0,
        "provider_calls": 1,
    }
    assert "[crash-1] agent: cancel_order for order 42: {'id': 'cancel_42'}" in output
    assert "[crash-1] step desk.agent: completed" in output
