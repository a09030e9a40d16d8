"""The guarantees a demo run must show, checked from its recorded data.

``intention-kernel demo`` exits non-zero if any check fails. So the demo is also a
smoke test of a real SQLite store.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from intention_kernel import StepStatus
from intention_kernel._demo.billing import INVOICES
from intention_kernel._demo.transcript import Check, Restart, Scene, Summary, TurnView

__all__ = ["check_run"]


def check_run(
    scenes: tuple[Scene, ...], summary: Summary, charges: list[dict[str, Any]]
) -> list[Check]:
    by_key = {s.key: s for s in scenes}
    (proposal,) = by_key["b"].turns()
    restart = next(s for s in by_key["b"].steps if isinstance(s, Restart))
    (pending_read,) = by_key["c"].turns()
    (accepted,) = by_key["d"].turns()
    (replay,) = by_key["e"].turns()
    _, dedup = by_key["f"].turns()
    g = by_key["g"].turns()
    lost, refused, reconciled = g[1], g[3], g[5]
    per_intent = Counter(c["payment_intent_id"] for c in charges)

    def status(view: TurnView) -> str:
        return ",".join(str(s.status) for s in view.result.steps)

    return [
        Check(
            "each payment intent charged at most once",
            bool(per_intent) and max(per_intent.values()) == 1,
            ", ".join(f"{pi}: {n}" for pi, n in sorted(per_intent.items())) or "no charges",
        ),
        Check(
            "nothing charged before confirmation",
            proposal.provider_calls == 0 and status(proposal) == StepStatus.AWAITING_CONFIRMATION,
            f"steps {status(proposal)}, provider calls {proposal.provider_calls}",
        ),
        Check(
            "the pending confirmation survived the restart and the read",
            proposal.result.interaction is not None
            and restart.interaction is not None
            and restart.interaction.id == proposal.result.interaction.id
            and pending_read.result.interaction is not None
            and pending_read.result.interaction.id == proposal.result.interaction.id,
            "the same interaction before and after the restart, and after the read",
        ),
        Check(
            "acceptance called the provider exactly once",
            accepted.provider_calls_delta == 1 and status(accepted) == StepStatus.COMPLETED,
            f"steps {status(accepted)}, provider calls +{accepted.provider_calls_delta}",
        ),
        Check(
            "the retried delivery was replayed and ran nothing",
            replay.result.replayed
            and replay.provider_calls_delta == 0
            and replay.outbox_delta == 0
            and replay.result.checkpoint_version == accepted.result.checkpoint_version,
            f"replayed={replay.result.replayed}, provider calls +{replay.provider_calls_delta}, "
            f"outbox +{replay.outbox_delta}",
        ),
        Check(
            "the second charge of the payment intent came from its receipt",
            dedup.provider_calls_delta == 0
            and status(dedup) == StepStatus.COMPLETED
            and dedup.result.steps[0].value == accepted.result.steps[0].value,
            f"provider calls +{dedup.provider_calls_delta}, same charge: "
            f"{dedup.result.steps[0].value == accepted.result.steps[0].value}",
        ),
        Check(
            "a lost response left the receipt uncertain",
            status(lost) == StepStatus.UNCERTAIN
            and [str(r.status) for r in lost.receipts] == ["uncertain"]
            and lost.provider_calls_delta == 1,
            f"steps {status(lost)}, receipts {[str(r.status) for r in lost.receipts]}",
        ),
        Check(
            "the retry of an uncertain charge failed closed",
            status(refused) == StepStatus.UNCERTAIN and refused.provider_calls_delta == 0,
            f"steps {status(refused)}, provider calls +{refused.provider_calls_delta}",
        ),
        Check(
            "after reconciliation the recorded charge is returned without a call",
            status(reconciled) == StepStatus.COMPLETED
            and reconciled.provider_calls_delta == 0
            and reconciled.result.steps[0].value is not None
            and reconciled.result.steps[0].value.get("payment_intent_id")
            == INVOICES["43"].payment_intent_id,
            f"steps {status(reconciled)}, provider calls +{reconciled.provider_calls_delta}",
        ),
        Check(
            "every committed turn announced exactly once",
            summary.turns_committed == summary.deliveries - 1,
            f"{summary.turns_committed} turn.committed events for {summary.deliveries} "
            "deliveries (one was a replay)",
        ),
    ]
