"""The billing demo: its scenes prove the guarantees, and its command runs them."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from intention_kernel import InterpretationRequest, Kernel
from intention_kernel._demo import (
    ACTOR,
    INVOICES,
    THREAD_ID,
    ChargeRejected,
    DemoRun,
    FakePaymentProvider,
    OperatorAction,
    Restart,
    TurnView,
    build_agent,
    build_interpreter,
    run_demo,
)
from intention_kernel.cli._common import DEFAULT_DB_URL, resolve_db_url, sqlite_path
from intention_kernel.durability.sqlite import SQLiteDurability

# One xdist worker runs this module, so the demo (a module fixture) runs once.
pytestmark = pytest.mark.xdist_group("demo")

PI_42 = INVOICES["42"].payment_intent_id
PI_43 = INVOICES["43"].payment_intent_id


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    return asyncio.run(run_demo(path))


def turns(run: DemoRun, key: str) -> list[TurnView]:
    return run.scene(key).turns()


def statuses(view: TurnView) -> list[str]:
    return [str(s.status) for s in view.result.steps]


def ledger(path: str, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


# -- the scenes ------------------------------------------------------------------------------


def test_every_check_of_the_demo_passes(demo_run: DemoRun) -> None:
    assert demo_run.ok, [c for c in demo_run.checks if not c.passed]
    assert [s.key for s in demo_run.scenes] == ["a", "b", "c", "d", "e", "f", "g"]


def test_provider_ledger_has_one_charge_per_payment_intent_charged(demo_run: DemoRun) -> None:
    charges = ledger(
        demo_run.db_path,
        "SELECT payment_intent_id, amount_cents, idempotency_key FROM demo_provider_charges",
    )
    assert charges == [
        (PI_42, 12_500, f"payments.charge:charge:{PI_42}"),
        (PI_43, 4_999, f"payments.charge:charge:{PI_43}"),
    ]
    calls = ledger(demo_run.db_path, "SELECT payment_intent_id, outcome FROM demo_provider_calls")
    assert calls == [(PI_42, "charged"), (PI_43, "charged_response_lost")]
    assert demo_run.summary.provider_calls == 2
    assert demo_run.summary.charges == 2


def test_a_read_question_runs_at_once_without_a_receipt(demo_run: DemoRun) -> None:
    (read,) = turns(demo_run, "a")
    assert statuses(read) == ["completed"]
    assert read.result.steps[0].capability_id == "billing.balance"
    assert "$125.00 due" in read.result.reply
    assert read.receipts == ()
    assert read.provider_calls == 0


def test_a_charge_waits_for_confirmation_and_charges_nothing(demo_run: DemoRun) -> None:
    (proposal,) = turns(demo_run, "b")
    assert statuses(proposal) == ["awaiting_confirmation"]
    interaction = proposal.result.interaction
    assert interaction is not None
    assert interaction.kind == "confirmation"
    assert interaction.capability_id == "payments.charge"
    assert interaction.input["payment_intent_id"] == PI_42
    assert "$125.00" in proposal.result.reply
    assert proposal.receipts == ()
    assert proposal.provider_calls == 0


def test_pending_confirmation_survives_a_restart_and_an_unrelated_read(demo_run: DemoRun) -> None:
    (proposal,) = turns(demo_run, "b")
    (restart,) = [s for s in demo_run.scene("b").steps if isinstance(s, Restart)]
    (read,) = turns(demo_run, "c")
    assert proposal.result.interaction is not None
    assert restart.interaction is not None
    assert restart.interaction.id == proposal.result.interaction.id
    assert restart.checkpoint_version == proposal.result.checkpoint_version
    assert statuses(read) == ["completed"]
    assert "$49.99 due" in read.result.reply
    assert read.result.interaction is not None
    assert read.result.interaction.id == proposal.result.interaction.id
    assert read.provider_calls == 0


def test_acceptance_charges_the_stored_operation_exactly_once(demo_run: DemoRun) -> None:
    (accept,) = turns(demo_run, "d")
    assert statuses(accept) == ["completed"]
    assert accept.result.interaction is None
    assert accept.provider_calls_delta == 1
    (receipt,) = accept.receipts
    assert receipt.status == "completed"
    assert receipt.key == f"payments.charge:charge:{PI_42}"
    assert accept.result.steps[0].value["amount_cents"] == 12_500


def test_a_retried_delivery_is_replayed_and_runs_nothing(demo_run: DemoRun) -> None:
    (accept,) = turns(demo_run, "d")
    (replay,) = turns(demo_run, "e")
    assert replay.turn_id == accept.turn_id
    assert replay.result.replayed is True
    assert accept.result.replayed is False
    assert replay.provider_calls_delta == 0
    assert replay.outbox_delta == 0
    expected = accept.result.to_dict() | {"replayed": True}
    assert replay.result.to_dict() == expected


def test_a_second_charge_of_the_same_payment_intent_comes_from_its_receipt(
    demo_run: DemoRun,
) -> None:
    (accept,) = turns(demo_run, "d")
    proposal, dedup = turns(demo_run, "f")
    assert statuses(proposal) == ["awaiting_confirmation"]
    assert statuses(dedup) == ["completed"]
    assert dedup.provider_calls_delta == 0
    assert dedup.result.steps[0].value == accept.result.steps[0].value
    assert [r.id for r in dedup.receipts] == [r.id for r in accept.receipts]
    assert "no new charge" in dedup.result.reply


def test_a_lost_response_is_uncertain_fails_closed_and_is_reconciled(demo_run: DemoRun) -> None:
    scene = demo_run.scene("g")
    views = scene.turns()
    assert [statuses(v) for v in views] == [
        ["awaiting_confirmation"],
        ["uncertain"],
        ["awaiting_confirmation"],
        ["uncertain"],
        ["awaiting_confirmation"],
        ["completed"],
    ]
    lost, refused, reconciled = views[1], views[3], views[5]
    # The provider applied the charge (one call, one charge) but the kernel cannot know.
    assert lost.provider_calls_delta == 1
    assert [str(r.status) for r in lost.receipts] == ["uncertain"]
    # A new turn does not retry blindly: the provider is not called.
    assert refused.provider_calls_delta == 0
    assert [str(r.status) for r in refused.receipts] == ["uncertain"]
    assert "EffectUncertainError" in (refused.result.steps[0].error or "")
    # The person reads the billing agent's own words (BillingReplies), the machine the error.
    for view in (lost, refused):
        assert view.result.reply == (
            "I could not tell whether the payment went through: the payment provider did not "
            "answer. To be safe I will not try it again until someone has checked with the "
            "provider."
        )
    (action,) = [s for s in scene.steps if isinstance(s, OperatorAction)]
    assert [r.key for r in action.uncertain] == [f"payments.charge:charge:{PI_43}"]
    assert action.provider_record is not None
    assert action.resolved.status == "completed"
    assert action.resolved.resolution is not None
    assert action.resolved.resolution.actor == ACTOR
    # After reconciliation the recorded charge is returned, still without a call.
    assert reconciled.provider_calls_delta == 0
    assert reconciled.result.steps[0].value == action.provider_record
    assert [r.id for r in reconciled.receipts] == [r.id for r in lost.receipts]


async def test_the_store_holds_what_the_transcript_showed(demo_run: DemoRun) -> None:
    async with SQLiteDurability(demo_run.db_path) as durability:
        receipts = await durability.list_receipts(THREAD_ID)
        assert [(r.key, str(r.status)) for r in receipts] == [
            (f"payments.charge:charge:{PI_42}", "completed"),
            (f"payments.charge:charge:{PI_43}", "completed"),
        ]
        assert receipts[1].resolution is not None
        assert receipts[1].resolution.applied is True
        events = await durability.read_outbox(limit=1000)
        types = [e.type for e in events]
        assert types.count("turn.committed") == demo_run.summary.turns_committed == 12
        assert types.count("receipt.resolved") == 1
        assert [e.position for e in events] == sorted(e.position for e in events)
        checkpoint = await durability.load_checkpoint(THREAD_ID)
        assert checkpoint is not None
        assert checkpoint.version == 12
        assert checkpoint.interaction is None
        assert checkpoint.facts["invoice.42.payment"].value["payment_intent_id"] == PI_42


# -- the agent on its own --------------------------------------------------------------------


async def test_balance_reports_a_paid_invoice_and_no_rejects_a_charge(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    provider = FakePaymentProvider(path)
    await provider.open()
    async with SQLiteDurability(path) as durability:
        kernel = Kernel(build_agent(provider), durability)
        await kernel.turn("t", "1", "pay invoice 42")
        await kernel.turn("t", "2", "yes")
        paid = await kernel.turn("t", "3", "how much is due on invoice 42?")
        assert "is paid (charge ch_000001)" in paid.reply
        await kernel.turn("t", "4", "pay invoice 44")
        rejected = await kernel.turn("t", "5", "no, cancel that")
        assert [str(s.status) for s in rejected.steps] == ["rejected"]
        assert rejected.interaction is None
        unknown = await kernel.turn("t", "6", "pay invoice 99")
        assert "can't find invoice 99" in unknown.reply
    assert [c.payment_intent_id for c in await provider.calls()] == [PI_42]


async def test_a_definite_provider_refusal_is_recorded_failed_and_may_be_retried(
    tmp_path: Path,
) -> None:
    path = tmp_path / "refused.db"
    provider = FakePaymentProvider(path)
    await provider.open()
    pi_44 = INVOICES["44"].payment_intent_id
    key = f"payments.charge:charge:{pi_44}"
    # Someone else used the idempotency key for another amount: the provider says 400.
    await provider.create_charge(
        payment_intent_id=pi_44, amount_cents=1, currency="usd", idempotency_key=key
    )
    async with SQLiteDurability(path) as durability:
        kernel = Kernel(build_agent(provider), durability)
        await kernel.turn("t", "1", "pay invoice 44")
        refused = await kernel.turn("t", "2", "yes")
        assert [str(s.status) for s in refused.steps] == ["failed"]
        assert "EffectNotAppliedError" in (refused.steps[0].error or "")
        assert refused.reply == (
            "The payment did not go through and nothing was charged. You can ask again."
        )
        (receipt,) = await durability.list_receipts("t")
        assert receipt.status == "failed"
        # failed (not uncertain): a later attempt calls the provider again.
        await kernel.turn("t", "3", "pay invoice 44")
        await kernel.turn("t", "4", "yes")
        (retried,) = await durability.list_receipts("t")
        assert (retried.status, retried.attempt) == ("failed", 2)
    outcomes = [c.outcome for c in await provider.calls()]
    assert outcomes == ["charged", "rejected", "rejected"]


async def test_the_provider_charges_once_per_idempotency_key(tmp_path: Path) -> None:
    provider = FakePaymentProvider(tmp_path / "provider.db")
    await provider.open()
    first = await provider.create_charge(
        payment_intent_id="pi_1", amount_cents=500, currency="usd", idempotency_key="k1"
    )
    again = await provider.create_charge(
        payment_intent_id="pi_1", amount_cents=500, currency="usd", idempotency_key="k1"
    )
    assert again == first
    with pytest.raises(ChargeRejected):
        await provider.create_charge(
            payment_intent_id="pi_1", amount_cents=999, currency="usd", idempotency_key="k1"
        )
    assert len(await provider.charges()) == 1
    assert [c.outcome for c in await provider.calls()] == [
        "charged",
        "idempotent_replay",
        "rejected",
    ]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("what do I owe on invoice 42?", ("billing.balance", {"invoice_id": "42"})),
        ("How much is due on invoice #43", ("billing.balance", {"invoice_id": "43"})),
        ("pay invoice 42", ("payments.charge", {"payment_intent_id": PI_42})),
        ("please pay invoice 99", ("billing.balance", {"invoice_id": "99"})),
        ("yes", "accept"),
        ("Confirm", "accept"),
        ("no", "reject"),
        ("cancel it", "reject"),
        ("tell me a joke", None),
    ],
)
async def test_the_rules_map_messages_to_intents_and_answers(
    message: str, expected: tuple[str, dict[str, str]] | str | None
) -> None:
    request = InterpretationRequest(
        thread_id="t",
        turn_id="1",
        message=message,
        messages=(),
        facts={},
        interaction=None,
        catalog=(),
    )
    interpretation = await build_interpreter().interpret(request)
    if isinstance(expected, tuple):
        capability_id, subset = expected
        (intent,) = interpretation.intents
        assert intent.capability_id == capability_id
        assert subset.items() <= dict(intent.input).items()
    else:
        assert interpretation.intents == ()
        assert interpretation.answer == expected
    if expected is None:
        assert interpretation.reply is not None


# -- the command -----------------------------------------------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "intention_kernel", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


def test_the_demo_command_prints_the_transcript_and_exits_0(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = run_cli("demo", "--db", str(db))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for line in (
        "(a) A read question",
        "turn delivery-01",
        "what do I owe on invoice 42?",
        "awaiting_confirmation",
        "pending confirmation survived",
        "turn delivery-04 replayed=True",
        "no new charge was made",
        "uncertain",
        "operator reconciles the uncertain receipt",
        "all checks passed",
    ):
        assert line in out, line
    assert re.search(r"turns committed\s*│\s*12\b", out)
    assert re.search(r"provider calls\s*│\s*2\b", out)
    assert re.search(r"receipt\.resolved: 1\b", out)
    assert "FAIL" not in out
    # The transcript is all there is: no raw log record (the library's WARNING about the
    # uncertain charge, printed by Python's last-resort handler) interrupts it.
    assert done.stderr == "", done.stderr
    raw = [line for line in out.splitlines() if re.match(r"(effect '|WARNING|INFO)", line)]
    assert raw == []
    # --db keeps the store; a second run recreates it from scratch.
    again = run_cli("demo", "--db", f"sqlite:///{db}")
    assert again.returncode == 0, again.stderr
    assert ledger(str(db), "SELECT COUNT(*) FROM demo_provider_calls") == [(2,)]


def test_the_demo_refuses_to_overwrite_a_database_it_did_not_create(tmp_path: Path) -> None:
    store = tmp_path / "intention-kernel.db"
    conn = sqlite3.connect(store)
    conn.execute("CREATE TABLE ik_turns (x)")
    conn.commit()
    conn.close()
    before = store.read_bytes()
    done = run_cli("demo", "--db", str(store))
    assert done.returncode == 2
    assert "was not created by the demo" in done.stderr
    assert store.read_bytes() == before


def test_the_demo_never_uses_the_store_in_the_environment(tmp_path: Path) -> None:
    store = tmp_path / "real.db"
    store.write_text("not a demo")
    done = run_cli("demo", env={"INTENTION_KERNEL_DB": f"sqlite:///{store}"})
    assert done.returncode == 0, done.stderr
    assert store.read_text() == "not a demo"


def test_the_demo_refuses_a_store_that_is_not_sqlite() -> None:
    done = run_cli("demo", "--db", "postgresql://nobody@127.0.0.1/none")
    assert done.returncode == 2
    assert "not a SQLite store" in done.stderr


def test_without_the_cli_extra_the_command_says_what_to_install() -> None:
    code = "import sys; sys.modules['typer'] = None\nfrom intention_kernel.cli import main\nmain()"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "pip install 'intention-kernel[cli]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_store_commands_resolve_db_from_flag_then_environment_then_default() -> None:
    env = {"INTENTION_KERNEL_DB": "sqlite:///from-env.db"}
    assert resolve_db_url("postgresql://h/db", env) == "postgresql://h/db"
    assert resolve_db_url(None, env) == "sqlite:///from-env.db"
    assert resolve_db_url(None, {}) == DEFAULT_DB_URL == "sqlite:///intention-kernel.db"


def test_sqlite_urls_and_paths_name_the_same_file() -> None:
    assert sqlite_path("demo.db") == "demo.db"
    assert sqlite_path("sqlite:///demo.db") == "demo.db"
    assert sqlite_path("sqlite:////tmp/demo.db") == "/tmp/demo.db"
    with pytest.raises(ValueError, match="not a SQLite store"):
        sqlite_path("postgresql://h/db")


async def test_the_serve_factory_builds_a_working_agent_without_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from intention_kernel._demo.serve import PROVIDER_DB_ENV_VAR
    from intention_kernel.cli._common import load_agent

    ledger = tmp_path / "provider.db"
    monkeypatch.setenv(PROVIDER_DB_ENV_VAR, str(ledger))
    agent = load_agent("intention_kernel._demo:serve_agent")
    async with SQLiteDurability(tmp_path / "app.db") as store:
        kernel = Kernel(agent, store)
        await kernel.turn("acct", "1", "pay invoice 42")
        result = await kernel.turn("acct", "2", "yes")
    assert result.steps[0].status == "completed"
    with sqlite3.connect(ledger) as conn:
        assert conn.execute("SELECT count(*) FROM demo_provider_charges").fetchone() == (1,)


def test_the_serve_factory_puts_its_provider_beside_a_sqlite_store() -> None:
    from intention_kernel._demo.serve import PROVIDER_DB_ENV_VAR, provider_path

    assert provider_path("sqlite:////srv/app/app.db", {}) == Path("/srv/app/app.demo-provider.db")
    assert provider_path("sqlite:///data/app.db", {}) == Path("data/app.demo-provider.db")
    assert provider_path("postgresql://h/db", {}) == Path("demo-provider.db")
    assert provider_path(None, {}) == Path("demo-provider.db")
    chosen = {PROVIDER_DB_ENV_VAR: "/var/lib/ledger.db"}
    assert provider_path("sqlite:///app.db", chosen) == Path("/var/lib/ledger.db")


def _make_plan(target: str, venv: Path) -> list[str]:
    """The commands ``make <target>`` would run with ``.venv`` at ``venv`` (``make -n``)."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        ["make", "-n", "-C", str(root), target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [line for line in proc.stdout.splitlines() if "pip install" in line]


def test_make_demo_installs_only_the_cli_extra_and_make_test_then_installs_the_rest(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    assert _make_plan("demo", venv) == [
        f"{venv}/bin/python -m pip install --quiet --upgrade pip",
        f"{venv}/bin/python -m pip install --quiet -e '.[cli]'",
    ]
    # After `make demo` (its venv and its stamp exist), `make test` installs dev.
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".demo-installed").touch()
    assert _make_plan("test", venv) == [f"{venv}/bin/python -m pip install --quiet -e '.[dev]'"]
    assert _make_plan("demo", venv) == []
