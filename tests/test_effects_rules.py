"""The receipt state machine, as pure rules (every adapter persists what these return)."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime

import pytest

from intention_kernel._effects import (
    Receipt,
    ReceiptStatus,
    Resolution,
    plan_effect,
    resolve,
    settle,
)
from intention_kernel.errors import ReceiptStateError, TenantMismatchError

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _plan(existing: Receipt | None):  # type: ignore[no-untyped-def]
    return plan_effect(existing, thread_id="t", key="k", turn_id="turn", step_id="s", now=NOW)


def _receipt(status: ReceiptStatus, attempt: int = 1) -> Receipt:
    return Receipt("r1", "t", "k", status, "old", "s0", attempt, created_at=NOW, updated_at=NOW)


def test_no_receipt_prepares_a_first_attempt() -> None:
    plan = _plan(None)
    assert plan.outcome == "execute"
    assert plan.write is not None and plan.write.status == "prepared" and plan.write.attempt == 1


def test_completed_replays_without_writing() -> None:
    plan = _plan(_receipt(ReceiptStatus.COMPLETED))
    assert (plan.outcome, plan.write) == ("replay", None)


def test_uncertain_fails_closed() -> None:
    assert _plan(_receipt(ReceiptStatus.UNCERTAIN)).outcome == "fail_closed"


def test_abandoned_prepared_becomes_uncertain_and_fails_closed() -> None:
    plan = _plan(_receipt(ReceiptStatus.PREPARED))
    assert plan.outcome == "fail_closed"
    assert plan.write is not None and plan.write.status == "uncertain"


def test_failed_retries_on_the_same_receipt_with_the_next_attempt() -> None:
    plan = _plan(_receipt(ReceiptStatus.FAILED, attempt=2))
    assert plan.outcome == "execute"
    assert plan.write is not None
    assert (plan.write.id, plan.write.attempt, plan.write.turn_id) == ("r1", 3, "turn")


@pytest.mark.parametrize("outcome", ["completed", "failed", "uncertain"])
def test_settling_changes_only_the_outcome_fields(outcome: str) -> None:
    # Every field set to a value of its own, so that a field the settlement dropped or
    # mixed up with another would show.
    prepared = Receipt(
        "r1",
        "t",
        "k",
        ReceiptStatus.PREPARED,
        "turn",
        "s1",
        3,
        created_at=NOW,
        updated_at=NOW,
        resolution=Resolution(False, "note", "op", NOW),
        announced=True,
        tenant_id="acme",
        actor="alice",
    )
    later = datetime(2026, 1, 2, tzinfo=UTC)
    settled = settle(prepared, outcome, now=later, value={"v": 1}, error="why")  # type: ignore[arg-type]
    outcome_fields = {"status", "value", "error", "updated_at"}
    for f in fields(Receipt):
        if f.name not in outcome_fields:
            assert getattr(settled, f.name) == getattr(prepared, f.name), f.name
    assert settled.status is ReceiptStatus(outcome)
    assert settled.value == ({"v": 1} if outcome == "completed" else None)
    assert (settled.error, settled.updated_at) == ("why", later)
    assert settled == replace(
        prepared,
        status=ReceiptStatus(outcome),
        value=settled.value,
        error="why",
        updated_at=later,
    )


def test_settling_with_an_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="applied"):
        settle(_receipt(ReceiptStatus.PREPARED), "applied", now=NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize("outcome", ["completed", "failed", "uncertain"])
def test_only_prepared_receipts_settle(outcome: str) -> None:
    settled = settle(_receipt(ReceiptStatus.PREPARED), outcome, now=NOW, value=1)  # type: ignore[arg-type]
    assert settled.status == outcome
    assert settled.value == (1 if outcome == "completed" else None)
    with pytest.raises(ReceiptStateError):
        settle(settled, "completed", now=NOW)


@pytest.mark.parametrize("status", [ReceiptStatus.COMPLETED, ReceiptStatus.FAILED])
def test_settled_receipts_cannot_be_resolved(status: ReceiptStatus) -> None:
    with pytest.raises(ReceiptStateError) as refused:
        resolve(_receipt(status), applied=True, value=None, note=None, actor=None, now=NOW)
    # The message names both states that can be resolved (SPEC: uncertain, or prepared by
    # an attempt that did not finish), not only the first.
    assert str(refused.value).endswith(
        f"is {status}; only an uncertain receipt, or a prepared one left by an attempt that "
        "did not finish, can be resolved"
    )


@pytest.mark.parametrize("status", [ReceiptStatus.UNCERTAIN, ReceiptStatus.PREPARED])
def test_uncertain_and_abandoned_prepared_receipts_can_be_resolved(status: ReceiptStatus) -> None:
    done = resolve(_receipt(status), applied=False, value=None, note="no", actor="ops", now=NOW)
    assert done.status == ReceiptStatus.FAILED and done.resolution is not None


def test_resolution_records_who_and_why() -> None:
    done = resolve(
        _receipt(ReceiptStatus.UNCERTAIN),
        applied=True,
        value={"x": 1},
        note="n",
        actor="a",
        now=NOW,
    )
    assert done.status == "completed" and done.value == {"x": 1}
    assert done.resolution is not None and (done.resolution.note, done.resolution.actor) == (
        "n",
        "a",
    )


@pytest.mark.parametrize("status", list(ReceiptStatus))
def test_a_receipt_of_another_tenant_is_refused_whatever_its_state(status: ReceiptStatus) -> None:
    acme = replace(_receipt(status), tenant_id="acme", value={"secret": 1})
    for other in ("globex", None):
        with pytest.raises(TenantMismatchError) as refused:
            plan_effect(
                acme, thread_id="t", key="k", turn_id="turn", step_id="s", now=NOW, tenant_id=other
            )
        assert refused.value.receipt is None
    mine = plan_effect(
        acme, thread_id="t", key="k", turn_id="turn", step_id="s", now=NOW, tenant_id="acme"
    )
    assert mine.existing == acme


def test_a_new_receipt_records_the_tenant_of_its_turn() -> None:
    plan = plan_effect(
        None, thread_id="t", key="k", turn_id="turn", step_id="s", now=NOW, tenant_id="acme"
    )
    assert plan.write is not None and plan.write.tenant_id == "acme"
