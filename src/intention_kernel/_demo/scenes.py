"""The demo's scenes, run against a real SQLite file and returned as data.

:func:`run_demo` plays the billing conversation scene by scene.
It returns a :class:`DemoRun`.
That holds every turn's :class:`~intention_kernel.TurnResult`.
With each come the receipts and provider-ledger counts read from disk right after it.
It also holds the simulated restart and the operator's reconciliation.
A summary and the checks that the guarantees held complete it.
Rendering is someone else's job.
``intention-kernel demo`` renders with rich; the tests assert on the data.
An ``observer`` receives each scene and step as it happens, so a renderer can stream.

The scenes, on one thread:

- (a) A read question.
- (b) A charge that waits for confirmation.
  Then the process's state restarts: the adapter is closed and the file reopened.
- (c) A read question while the charge is pending.
- (d) Acceptance: the provider is called once.
- (e) The same delivery retried under the same turn ID: replayed, nothing runs.
- (f) The same payment intent charged again in new turns.
  The receipt answers, and the provider is not called.
- (g) A lost provider response: ``uncertain``.
  A retry fails closed, and an operator reconciles.
  A last retry returns the reconciled charge.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from intention_kernel import Kernel, OutboxEvent
from intention_kernel._demo.billing import INVOICES, build_agent
from intention_kernel._demo.checks import check_run
from intention_kernel._demo.provider import FakePaymentProvider
from intention_kernel._demo.transcript import (
    DemoRun,
    OperatorAction,
    Restart,
    Scene,
    SceneStep,
    Summary,
    TurnView,
)
from intention_kernel.durability.sqlite import SQLiteDurability

__all__ = ["ACTOR", "THREAD_ID", "Observer", "read_all_events", "run_demo"]

THREAD_ID = "acct-acme"
ACTOR = "ops@example.com"


Observer = Callable[[Scene | SceneStep], None]


async def read_all_events(durability: SQLiteDurability) -> list[OutboxEvent]:
    """Every committed outbox event, paging with the ``position`` cursor as a relay would."""
    events: list[OutboxEvent] = []
    after: int | None = None
    while True:
        page = await durability.read_outbox(after=after, limit=100)
        events.extend(page)
        if len(page) < 100:
            return events
        after = page[-1].position


async def run_demo(path: str | os.PathLike[str], *, observer: Observer | None = None) -> DemoRun:
    """Play every scene on the SQLite file at ``path`` (which should be new or empty)."""
    director = _Director(os.fspath(path), observer)
    try:
        await director.play()
    finally:
        await director.close()
    return director.result()


class _Director:
    def __init__(self, path: str, observer: Observer | None) -> None:
        self.path = path
        self.observer = observer
        self.scenes: list[Scene] = []
        self.deliveries = 0
        self._numbered = 0
        self._process: AsyncExitStack | None = None
        self._durability: SQLiteDurability | None = None
        self._kernel: Kernel | None = None
        self._provider: FakePaymentProvider | None = None
        self._summary: Summary | None = None
        self._provider_charges: list[dict[str, Any]] = []

    # -- the play ------------------------------------------------------------------------------

    async def play(self) -> None:
        await self.start()
        pi_42, pi_43 = INVOICES["42"].payment_intent_id, INVOICES["43"].payment_intent_id

        self.scene("a", "A read question", "Reads run at once: no confirmation, no receipt.")
        await self.turn("what do I owe on invoice 42?")

        self.scene(
            "b",
            "A charge waits for confirmation",
            "The write is planned, not run: the exact input is stored on the agenda and a "
            "confirmation opens. Then the process 'restarts': the adapter is closed, the "
            "kernel, agent and provider objects are dropped, and the file is reopened.",
        )
        await self.turn("pay invoice 42")
        await self.restart()

        self.scene(
            "c",
            "A read question while the charge is pending",
            "Unrelated safe questions are answered; the confirmation stays active.",
        )
        await self.turn("what do I owe on invoice 43?")

        self.scene(
            "d",
            "Acceptance runs exactly the stored charge",
            "The accepting turn runs the planned operation (not a re-interpretation): the "
            "provider is called once, under the receipt's idempotency key.",
        )
        accept = await self.turn("yes")

        self.scene(
            "e",
            "The same delivery, retried",
            "The channel redelivers the same message with the same turn ID: the stored result "
            "comes back with replayed=True; nothing is interpreted, run or committed again.",
        )
        await self.turn("yes", turn_id=accept.turn_id)

        self.scene(
            "f",
            "The same payment intent, charged again in new turns",
            f"A new request for invoice 42 is accepted, but the effect key charge:{pi_42} "
            "already has a completed receipt: it returns the original charge, the provider is "
            "not called.",
        )
        await self.turn("pay invoice 42")
        await self.turn("yes")

        self.scene(
            "g",
            "A lost provider response",
            "The provider applies the charge for invoice 43 but its response is lost (a "
            "timeout). The receipt becomes uncertain and later attempts fail closed, without "
            "calling the provider, until an operator reconciles it against the provider's "
            "ledger. After that the recorded charge is returned.",
        )
        self.provider.simulate_lost_response(pi_43)
        await self.turn("pay invoice 43")
        await self.turn("yes")
        await self.turn("pay invoice 43")
        await self.turn("yes")
        await self.reconcile()
        await self.turn("pay invoice 43")
        await self.turn("yes")

        await self.summarize()

    # -- moves ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._provider = FakePaymentProvider(self.path)
        await self._provider.open()
        self._process = AsyncExitStack()
        self._durability = await self._process.enter_async_context(SQLiteDurability(self.path))
        # The provider is built before the agent because the agent's capabilities call it.
        self._kernel = Kernel(build_agent(self._provider), self._durability)

    async def close(self) -> None:
        process, self._process = self._process, None
        self._durability = self._kernel = None
        if process is not None:
            await process.aclose()

    async def restart(self) -> None:
        await self.close()
        self._provider = None
        await self.start()
        checkpoint = await self.durability.load_checkpoint(THREAD_ID)
        self.record(
            Restart(
                checkpoint_version=checkpoint.version if checkpoint else None,
                interaction=checkpoint.interaction if checkpoint else None,
            )
        )

    def scene(self, key: str, title: str, narration: str) -> None:
        scene = Scene(key, title, narration)
        self.scenes.append(scene)
        if self.observer is not None:
            self.observer(scene)

    def record(self, step: SceneStep) -> None:
        self.scenes[-1].steps.append(step)
        if self.observer is not None:
            self.observer(step)

    async def turn(self, message: str, *, turn_id: str | None = None) -> TurnView:
        if turn_id is None:
            self._numbered += 1
            turn_id = f"delivery-{self._numbered:02d}"
        calls_before = await self.provider.call_count()
        events_before = len(await read_all_events(self.durability))
        result = await self.kernel.turn(THREAD_ID, turn_id, message)
        self.deliveries += 1
        calls = await self.provider.call_count()
        events = len(await read_all_events(self.durability))
        wanted = {rid for step in result.steps for rid in step.receipt_ids}
        receipts = tuple(
            r for r in await self.durability.list_receipts(THREAD_ID) if r.id in wanted
        )
        view = TurnView(
            turn_id=turn_id,
            message=message,
            result=result,
            receipts=receipts,
            provider_calls=calls,
            provider_calls_delta=calls - calls_before,
            charges=len(await self.provider.charges()),
            outbox_events=events,
            outbox_delta=events - events_before,
        )
        self.record(view)
        return view

    async def reconcile(self) -> None:
        """What an operator does with an uncertain receipt: ask the provider, then record."""
        uncertain = tuple(await self.durability.list_receipts(THREAD_ID, status="uncertain"))
        receipt = uncertain[0]
        # The receipt's key is the idempotency key the provider was given.
        record = await self.provider.find_charge(receipt.key)
        applied = record is not None
        note = (
            f"provider ledger shows {record['charge_id']} for this idempotency key"
            if record is not None
            else "provider has no charge for this idempotency key"
        )
        resolved = await self.durability.resolve_receipt(
            THREAD_ID, receipt.key, applied=applied, value=record, note=note, actor=ACTOR
        )
        self.record(OperatorAction(uncertain, record, resolved, note))

    async def summarize(self) -> None:
        events = await read_all_events(self.durability)
        receipts = await self.durability.list_receipts(THREAD_ID)
        self._provider_charges = await self.provider.charges()
        self._summary = Summary(
            deliveries=self.deliveries,
            turns_committed=sum(1 for e in events if e.type == "turn.committed"),
            provider_calls=await self.provider.call_count(),
            charges=len(self._provider_charges),
            receipts_by_status=dict(Counter(str(r.status) for r in receipts)),
            events_by_type=dict(sorted(Counter(e.type for e in events).items())),
        )

    # -- results -------------------------------------------------------------------------------

    def result(self) -> DemoRun:
        assert self._summary is not None, "the play did not finish"
        scenes = tuple(self.scenes)
        return DemoRun(
            db_path=self.path,
            thread_id=THREAD_ID,
            scenes=scenes,
            summary=self._summary,
            checks=tuple(check_run(scenes, self._summary, self._provider_charges)),
        )

    @property
    def durability(self) -> SQLiteDurability:
        assert self._durability is not None
        return self._durability

    @property
    def kernel(self) -> Kernel:
        assert self._kernel is not None
        return self._kernel

    @property
    def provider(self) -> FakePaymentProvider:
        assert self._provider is not None
        return self._provider
