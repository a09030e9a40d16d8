"""The operator console, end to end in headless Chromium (Debian's, driven by Playwright).

The host serves the demo billing agent over real HTTP from a thread of this
process, so each test can arm the fake provider (a lost response) before the
browser acts. Without /usr/bin/chromium or the playwright package the browser
tests skip with the reason, unless INTENTION_KERNEL_REQUIRE_SERVICES=1 (CI).

The main view is compared with ``tests/baselines/console-main.png`` (see
``visual_support`` for how rendering is made repeatable and what tolerance
applies). After an intended change of the console's look, regenerate the baseline
and the README's picture, ``docs/console.png``, and commit both::

    INTENTION_KERNEL_UPDATE_DOCS=1 pytest tests/test_console.py -k baseline
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import service_unavailable
from host_support import opened_provider, serving_in_thread
from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel
from intention_kernel._demo import FakePaymentProvider, build_agent
from intention_kernel._facts import Evidence, FactRecord
from intention_kernel._turns import TurnScope
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing import _agents as agents
from intention_kernel.testing._agents import FakeProvider
from intention_kernel.testing.conformance import commit_for
from visual_support import DEJAVU, compare, pinned_fontconfig, save_baseline

# One xdist worker runs this module, so its browser (a module fixture) starts once.
pytestmark = pytest.mark.xdist_group("console")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Repeatable pixels for the baseline comparison.
    "--force-color-profile=srgb",
    "--font-render-hinting=none",
]
VIEWPORT = {"width": 1280, "height": 860}
#: Set to 1 to regenerate the screenshot baseline and the README's picture of the console.
UPDATE_DOCS = os.environ.get("INTENTION_KERNEL_UPDATE_DOCS") == "1"
ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "baselines" / "console-main.png"
DOCS_PICTURE = ROOT / "docs" / "console.png"
THREAD = "acct-acme"


@dataclass
class Host:
    url: str
    provider: FakePaymentProvider
    kernel: Kernel

    def turn(self, turn_id: str, message: str, thread: str = THREAD) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/v1/threads/{thread}/turns",
            json={"turn_id": turn_id, "message": message},
            timeout=30,
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def charges(self) -> list[dict[str, Any]]:
        """The charges the provider applied (from a worker thread: see opened_provider)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(lambda: asyncio.run(self.provider.charges())).result()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    provider = opened_provider(tmp_path / "provider.db")
    kernel = Kernel(build_agent(provider), InMemoryDurability())
    with serving_in_thread(create_app(kernel)) as url:
        yield Host(url, provider, kernel)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not CHROMIUM.exists():
        service_unavailable("Chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        service_unavailable("Playwright", f"the playwright package is not installed: {exc}")
    env: dict[str, str | float | bool] = dict(os.environ)
    if DEJAVU.is_dir():  # the same fonts on every machine, whatever else is installed
        env["FONTCONFIG_FILE"] = str(pinned_fontconfig(tmp_path_factory.mktemp("fonts")))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, env=env
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"the console raised in the browser: {errors}"


def test_accepting_the_pending_confirmation_completes_the_charge(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    expect(page.locator("#confirmation-prompt")).to_have_text(
        "Charge $125.00 to payment intent pi_demo_42 for invoice 42? Reply yes or no."
    )
    page.get_by_role("button", name="Accept").click()
    expect(page.locator("#messages .turn-steps")).to_contain_text("payments.charge")
    expect(page.locator("#messages .step .badge.completed")).to_have_text("completed")
    expect(page.locator("#confirmation")).to_be_hidden()
    expect(page.locator("#messages")).to_contain_text("Charged $125.00 for invoice 42")
    expect(page.locator("#facts")).to_contain_text("invoice.42.payment")
    expect(page.locator("#facts")).to_contain_text("payments.charge · turn console-")


def test_rejecting_the_pending_confirmation_cancels_it_and_charges_nothing(
    host: Host, page: Any
) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    expect(page.locator("#confirmation")).to_be_visible()
    page.get_by_role("button", name="Reject").click()
    expect(page.locator("#messages .step .badge.rejected")).to_have_text("rejected")
    expect(page.locator("#messages .turn-steps")).to_contain_text("payments.charge")
    expect(page.locator("#confirmation")).to_be_hidden()
    expect(page.locator("#messages")).to_contain_text("Cancelled: nothing was done.")
    expect(page.locator("#version")).to_have_text("· v2")

    thread = httpx.get(f"{host.url}/v1/threads/{THREAD}", timeout=30).json()
    assert thread["interaction"] is None
    assert thread["agenda"] == []
    assert httpx.get(f"{host.url}/v1/receipts", timeout=30).json() == {"receipts": []}
    assert host.charges() == []


def test_a_receipt_left_prepared_by_a_dead_attempt_is_shown_and_resolved(
    host: Host, page: Any
) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 43")
    # The attempt dies right after the store recorded "prepared", before the provider
    # was called: what a process killed mid-effect leaves behind.
    with faults.injected(faults.AFTER_RECEIPT_PREPARED, "raise"):
        died = httpx.post(
            f"{host.url}/v1/threads/{THREAD}/turns",
            json={"turn_id": "d2", "message": "yes"},
            timeout=30,
        )
    assert died.status_code == 500
    page.goto(f"{host.url}/console?thread={THREAD}")
    receipt = page.locator(".receipt", has_text="payments.charge:charge:pi_demo_43")
    expect(receipt.locator(".badge")).to_have_text("prepared")
    expect(receipt).to_contain_text("prepared by an attempt that did not finish · attempt 1")
    receipt.get_by_label("not applied").check()
    receipt.get_by_label("note").fill("no charge in the provider dashboard")
    receipt.get_by_role("button", name="Resolve").click()
    expect(page.locator("#banner")).to_have_text("payments.charge:charge:pi_demo_43 is now failed.")
    expect(page.locator("#no-receipts")).to_be_visible()
    assert host.charges() == []


def test_a_message_sent_from_the_console_is_a_turn(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(f"{host.url}/console?thread={THREAD}")
    page.get_by_label("Message").fill("what do I owe on invoice 43?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#messages")).to_contain_text("Invoice 43 (Acme Corp): $49.99 due.")
    expect(page.locator("#facts")).to_contain_text("invoice.43.amount_due_cents")


def test_an_uncertain_receipt_is_reconciled_from_the_console(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.provider.simulate_lost_response("pi_demo_43")
    host.turn("d1", "pay invoice 43")
    assert host.turn("d2", "yes")["steps"][0]["status"] == "uncertain"
    page.goto(f"{host.url}/console?thread={THREAD}")
    receipt = page.locator(".receipt", has_text="payments.charge:charge:pi_demo_43")
    expect(receipt).to_contain_text("ProviderTimeout")
    receipt.get_by_label("applied", exact=True).check()
    charge = {"charge_id": "ch_000001", "amount_cents": 4999, "currency": "usd"}
    receipt.get_by_label("value (JSON, if applied)").fill(json.dumps(charge))
    receipt.get_by_label("note").fill("found in the provider dashboard")
    receipt.get_by_role("button", name="Resolve").click()
    expect(page.locator("#banner")).to_have_text(
        "payments.charge:charge:pi_demo_43 is now completed."
    )
    expect(page.locator("#no-receipts")).to_be_visible()


def test_the_main_view_matches_its_baseline(host: Host, page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    if not DEJAVU.is_dir():
        service_unavailable(
            "DejaVu fonts", f"{DEJAVU} is missing (apt-get install fonts-dejavu-core)"
        )
    host.turn("d1", "what do I owe on invoice 42?")
    host.provider.simulate_lost_response("pi_demo_43")
    host.turn("d2", "pay invoice 43")
    host.turn("d3", "yes")
    host.turn("d4", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    expect(page.locator("#confirmation")).to_be_visible()
    expect(page.locator(".receipt")).to_have_count(1)
    expect(page.locator("#facts")).to_be_visible()
    page.evaluate("document.fonts.ready.then(() => true)")
    actual = tmp_path / "console-main.png"
    page.screenshot(path=str(actual), animations="disabled", caret="hide")
    browser = f"Chromium {page.context.browser.version}"
    if UPDATE_DOCS:
        save_baseline(actual, BASELINE, browser)
        shutil.copyfile(actual, DOCS_PICTURE)
    assert BASELINE.exists(), f"no baseline at {BASELINE}: run with INTENTION_KERNEL_UPDATE_DOCS=1"
    mismatch = compare(actual, BASELINE, tmp_path / "console-main-diff.png", browser)
    assert mismatch is None, (
        f"the console's main view no longer matches {BASELINE.relative_to(ROOT)}: {mismatch}. "
        f"Screenshot: {actual}. If the change is intended, regenerate the baseline and "
        "docs/console.png with INTENTION_KERNEL_UPDATE_DOCS=1 and commit them."
    )


def test_a_page_of_another_origin_cannot_accept_a_pending_charge(host: Host, page: Any) -> None:
    """The attack itself, in a real browser: a page served from another origin (another
    port of the same machine) posts an acceptance with ``no-cors`` and ``text/plain``,
    which needs no preflight. The host refuses it; nothing is charged."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    async def lure(request: Any) -> HTMLResponse:
        return HTMLResponse("<!doctype html><title>cat pictures</title>")

    host.turn("d1", "pay invoice 42")
    with serving_in_thread(Starlette(routes=[Route("/", lure)])) as elsewhere:
        page.goto(elsewhere)
        page.evaluate(
            """async (target) => {
                await fetch(target, {
                    method: "POST", mode: "no-cors",
                    headers: {"Content-Type": "text/plain"},
                    body: JSON.stringify({turn_id: "forged", answer: "accept"}),
                });
            }""",
            f"{host.url}/v1/threads/{THREAD}/turns",
        )
    thread = httpx.get(f"{host.url}/v1/threads/{THREAD}", timeout=30).json()
    assert thread["version"] == 1 and thread["interaction"] is not None
    assert host.charges() == []


# -- the queue: the landing view -------------------------------------------------------------


def seed_queue(host: Host) -> None:
    """Three threads that need an operator: an uncertain write, a write left prepared by
    an attempt that died, and a confirmation waiting for an answer; and a quiet one."""
    host.provider.simulate_lost_response("pi_demo_43")
    host.turn("d1", "pay invoice 43", thread="acct-uncertain")
    assert host.turn("d2", "yes", thread="acct-uncertain")["steps"][0]["status"] == "uncertain"
    host.turn("d1", "pay invoice 42", thread="acct-prepared")
    with faults.injected(faults.AFTER_RECEIPT_PREPARED, "raise"):
        died = httpx.post(
            f"{host.url}/v1/threads/acct-prepared/turns",
            json={"turn_id": "d2", "message": "yes"},
            timeout=30,
        )
    assert died.status_code == 500
    host.turn("d1", "pay invoice 42", thread="acct-waiting")
    host.turn("d1", "what do I owe on invoice 42?", thread="acct-quiet")


def test_the_landing_view_queues_what_needs_an_operator_across_threads(
    host: Host, page: Any
) -> None:
    from playwright.sync_api import expect

    seed_queue(host)
    page.goto(f"{host.url}/console")
    expect(page.locator("#main")).to_be_hidden()
    receipts = page.locator("#queue-receipts .queue-item")
    expect(receipts).to_have_count(2)
    uncertain = receipts.filter(has_text="acct-uncertain")
    expect(uncertain.locator(".badge")).to_have_text("uncertain")
    expect(uncertain).to_contain_text("payments.charge:charge:pi_demo_43")
    prepared = receipts.filter(has_text="acct-prepared")
    expect(prepared.locator(".badge")).to_have_text("prepared")
    expect(prepared).to_contain_text("prepared by an attempt that did not finish")
    # The attempt that died while accepting committed nothing: its thread still waits.
    pending = page.locator("#queue-interactions .queue-item")
    expect(pending).to_have_count(2)
    expect(pending.nth(0)).to_contain_text("Open thread acct-prepared")
    waiting = pending.filter(has_text="acct-waiting")
    expect(waiting).to_contain_text("Charge $125.00 to payment intent pi_demo_42")
    expect(page.locator("#queue")).not_to_contain_text("acct-quiet")

    waiting.get_by_role("link", name="Open thread acct-waiting").click()
    expect(page).to_have_url(f"{host.url}/console?thread=acct-waiting")
    expect(page.locator("#queue")).to_be_hidden()
    expect(page.locator("#confirmation")).to_be_visible()
    page.get_by_role("button", name="Accept").click()
    expect(page.locator("#messages .step .badge.completed")).to_have_text("completed")

    page.get_by_role("link", name="intention-kernel").click()
    expect(page.locator("#queue-interactions .queue-item")).to_have_count(1)
    uncertain.get_by_role("link", name="Open thread acct-uncertain").click()
    expect(page.locator(".receipt .badge")).to_have_text("uncertain")


def test_the_queue_with_nothing_to_do_says_so(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "what do I owe on invoice 42?")
    page.goto(f"{host.url}/console")
    expect(page.locator("#queue-no-receipts")).to_be_visible()
    expect(page.locator("#queue-no-interactions")).to_be_visible()


# -- the reconcile form ----------------------------------------------------------------------


def uncertain_receipt(host: Host, page: Any) -> Any:
    host.provider.simulate_lost_response("pi_demo_43")
    host.turn("d1", "pay invoice 43")
    host.turn("d2", "yes")
    page.goto(f"{host.url}/console?thread={THREAD}")
    return page.locator(".receipt", has_text="payments.charge:charge:pi_demo_43")


def requests_to_resolve(page: Any) -> list[str]:
    sent: list[str] = []
    page.on(
        "request",
        lambda request: sent.append(request.url) if "receipts/resolve" in request.url else None,
    )
    return sent


def test_invalid_json_is_refused_in_the_page_and_the_input_is_kept(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    receipt = uncertain_receipt(host, page)
    sent = requests_to_resolve(page)
    receipt.get_by_label("applied", exact=True).check()
    receipt.get_by_label("value (JSON, if applied)").fill('{"charge_id": ch_000001}')
    receipt.get_by_label("note").fill("found in the provider dashboard")
    receipt.get_by_role("button", name="Resolve").click()
    expect(receipt.locator(".form-error")).to_contain_text("invalid JSON")
    expect(page.locator("#banner")).to_be_hidden()  # nothing blames the host
    expect(receipt.get_by_label("value (JSON, if applied)")).to_have_value(
        '{"charge_id": ch_000001}'
    )
    page.get_by_role("button", name="Refresh").click()  # a re-render keeps it too
    expect(receipt.get_by_label("note")).to_have_value("found in the provider dashboard")
    expect(receipt.get_by_label("value (JSON, if applied)")).to_have_value(
        '{"charge_id": ch_000001}'
    )
    expect(receipt.get_by_label("applied", exact=True)).to_be_checked()
    assert sent == []
    assert httpx.get(f"{host.url}/v1/receipts", timeout=30).json()["receipts"][0]["status"] == (
        "uncertain"
    )


def test_the_form_requires_a_note_and_a_value_for_an_applied_write(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    receipt = uncertain_receipt(host, page)
    sent = requests_to_resolve(page)
    error = receipt.locator(".form-error")
    receipt.get_by_label("not applied").check()
    receipt.get_by_role("button", name="Resolve").click()
    expect(error).to_contain_text("Write a note")
    receipt.get_by_label("applied", exact=True).check()
    receipt.get_by_label("note").fill("found in the provider dashboard")
    receipt.get_by_role("button", name="Resolve").click()
    expect(error).to_contain_text("An applied write needs its value")
    assert sent == []
    # An explicit null is a value: the write returned nothing.
    receipt.get_by_label("value (JSON, if applied)").fill("null")
    receipt.get_by_role("button", name="Resolve").click()
    expect(page.locator("#banner")).to_have_text(
        "payments.charge:charge:pi_demo_43 is now completed."
    )
    assert len(sent) == 1
    [resolved] = httpx.get(f"{host.url}/v1/receipts", timeout=30).json()["receipts"]
    assert (resolved["status"], resolved["value"]) == ("completed", None)


def test_a_resolution_the_host_refuses_keeps_the_input_and_shows_the_problem(
    host: Host, page: Any
) -> None:
    from playwright.sync_api import expect

    receipt = uncertain_receipt(host, page)
    note = "checked the provider dashboard " * 80  # over the host's 2,000 characters
    receipt.get_by_label("not applied").check()
    receipt.get_by_label("note").fill(note)
    receipt.get_by_role("button", name="Resolve").click()
    expect(page.locator("#banner")).to_contain_text("Invalid request")
    expect(receipt.get_by_label("note")).to_have_value(note)
    expect(receipt.get_by_label("not applied")).to_be_checked()
    [still] = httpx.get(f"{host.url}/v1/receipts", timeout=30).json()["receipts"]
    assert still["status"] == "uncertain"


# -- long values, wide and narrow ------------------------------------------------------------


LONG_VALUE = {
    "charge_id": "ch_" + "7" * 180,
    "lines": [{"sku": f"sku-{n:04d}", "description": "x" * 60, "cents": n} for n in range(30)],
}
LONG_KEY = "invoice." + "9" * 90 + ".payment"


def long_fact(host: Host) -> None:
    """A committed thread holding a long JSON fact under a long key (a raw commit with
    this host's fingerprint, so that the thread shows as its own)."""
    record = FactRecord(LONG_KEY, LONG_VALUE, 1, Evidence("payments.charge", "d1", "d1#1"))

    async def operation(tx: Any) -> Any:
        commit = commit_for(tx, facts={LONG_KEY: record})
        checkpoint = replace(commit.checkpoint, agent_fingerprint=host.kernel.fingerprint)
        return replace(commit, checkpoint=checkpoint)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(
            lambda: asyncio.run(
                host.kernel.durability.with_turn(TurnScope(THREAD, "d1"), operation)
            )
        ).result()


@pytest.mark.parametrize("width", [1280, 375])
def test_a_long_json_fact_stays_inside_the_page(
    host: Host, browser: Any, tmp_path: Path, width: int
) -> None:
    from playwright.sync_api import expect

    long_fact(host)
    context = browser.new_context(viewport={"width": width, "height": 860}, device_scale_factor=1)
    try:
        page = context.new_page()
        page.goto(f"{host.url}/console?thread={THREAD}")
        expect(page.locator("#facts")).to_contain_text("ch_777")
        page.screenshot(path=str(tmp_path / f"console-{width}.png"), full_page=True)
        overflow = page.evaluate(
            """() => {
                const facts = document.querySelector("#facts");
                const card = facts.closest(".card").getBoundingClientRect();
                const cells = [...document.querySelectorAll("#facts td, #facts pre, #facts code")];
                return {
                    page: document.documentElement.scrollWidth - window.innerWidth,
                    cells: cells.filter((c) => c.getBoundingClientRect().right > card.right + 0.5)
                        .map((c) => c.tagName),
                };
            }"""
        )
        assert overflow == {"page": 0, "cells": []}, f"screenshot: {tmp_path}"
    finally:
        context.close()


def test_the_queue_fits_a_phone(host: Host, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    seed_queue(host)
    context = browser.new_context(viewport={"width": 375, "height": 860}, device_scale_factor=1)
    try:
        page = context.new_page()
        page.goto(f"{host.url}/console")
        expect(page.locator("#queue-receipts .queue-item")).to_have_count(2)
        page.screenshot(path=str(tmp_path / "queue-375.png"), full_page=True)
        width = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert width == 0, f"screenshot: {tmp_path}"
    finally:
        context.close()


# -- rounds and streaming --------------------------------------------------------------------

#: The kernel's time in the rounds host: deadlines are measured from it, and the page's
#: clock is set against it.
NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


class RoundsModel:
    """A model that works in rounds, scripted by message.

    ``"what do I owe, and pay it"``: round 1 reads the balance, round 2 proposes the
    charge (held for confirmation), round 3 writes the reply. ``"stream"``: round 1
    streams text and reads the balance; round 2 waits for ``gate`` (set from the test's
    thread), streams more and writes the reply."""

    multi_round = True

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.slow = threading.Event()  # a "look twice, slowly" turn waits at the gate

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        rounds = len(request.rounds)
        if request.message == "look twice, slowly":
            self.slow.set()
            await asyncio.to_thread(self.gate.wait, 30)
            return Interpretation(
                intents=[Intent("billing.balance", {"due": 1}), Intent("billing.balance", {})]
            )
        if request.message == "stream":
            if rounds == 0:
                assert request.stream is not None, "the console streams its turns"
                request.stream("Looking that up")
                return Interpretation(intents=[Intent("billing.balance", {"due": 4200})])
            await asyncio.to_thread(self.gate.wait, 30)
            assert request.stream is not None
            request.stream(" for you.")
            return Interpretation(reply="You owe 4200.")
        if rounds == 0:
            return Interpretation(intents=[Intent("billing.balance", {"due": 150})])
        if rounds == 1:
            due = request.rounds[0].steps[0].value["due"]
            charge = {"payment_intent_id": "pi_1", "amount": due}
            return Interpretation(intents=[Intent("payments.charge", charge)])
        return Interpretation(reply="You owe 150; the charge waits for your answer.")


@dataclass
class RoundsHost:
    url: str
    model: RoundsModel
    provider: FakeProvider


@pytest.fixture
def rounds_host() -> Iterator[RoundsHost]:
    model = RoundsModel()
    provider = FakeProvider()
    agent = replace(
        agents.billing_agent(provider, confirm_within=timedelta(minutes=15)), interpreter=model
    )
    kernel = Kernel(agent, InMemoryDurability(), clock=lambda: NOW)
    with serving_in_thread(create_app(kernel)) as url:
        yield RoundsHost(url, model, provider)
    model.gate.set()  # a test that failed midway leaves no turn waiting


def test_a_multi_round_turn_shows_each_rounds_steps_in_the_conversation(
    rounds_host: RoundsHost, page: Any
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{rounds_host.url}/console?thread={THREAD}")
    page.get_by_label("Message").fill("what do I owe, and pay it")
    page.get_by_role("button", name="Send").click()
    reply = page.locator("#messages .message.assistant")
    expect(reply).to_contain_text("You owe 150; the charge waits for your answer.")
    steps = page.locator("#messages .turn-steps")
    expect(steps).to_have_count(1)
    first, second = steps.locator(".round[data-round='1']"), steps.locator(".round[data-round='2']")
    expect(first).to_contain_text("round 1")
    expect(first.locator(".step")).to_have_count(1)
    expect(first.locator(".step")).to_contain_text('billing.balancecompleted{"due":150}')
    expect(second.locator(".step")).to_have_count(1)
    expect(second.locator(".step code")).to_have_text("payments.charge")
    expect(second.locator(".badge")).to_have_text("awaiting_confirmation")
    # The steps sit between the turn's message and its reply, in that order.
    order = page.locator("#messages > li").evaluate_all(
        "items => items.map((item) => item.className)"
    )
    assert order == ["message user", "turn-steps", "message assistant"]
    # What the page shows is what the host committed.
    thread = httpx.get(f"{rounds_host.url}/v1/threads/{THREAD}", timeout=30).json()
    assert thread["version"] == 1 and thread["interaction"]["input"]["amount"] == 150
    expect(page.locator("#confirmation-capability")).to_have_text("payments.charge")


def test_a_streamed_turn_shows_text_before_its_result_and_ends_with_the_reply(
    rounds_host: RoundsHost, page: Any
) -> None:
    from playwright.sync_api import expect

    accepts: list[str] = []
    page.on(
        "request",
        lambda r: accepts.append(r.headers.get("accept", "")) if r.url.endswith("/turns") else None,
    )
    page.goto(f"{rounds_host.url}/console?thread={THREAD}")
    page.get_by_label("Message").fill("stream")
    page.get_by_role("button", name="Send").click()
    streaming = page.locator("#messages .message.assistant.streaming")
    expect(streaming).to_contain_text("Looking that up")
    live = page.locator("#messages .turn-steps.live")
    expect(live.locator(".step .badge.completed")).to_have_text("completed")
    expect(live).to_contain_text("billing.balance")
    # Shown before the result: the turn has not committed yet.
    assert httpx.get(f"{rounds_host.url}/v1/threads/{THREAD}", timeout=30).status_code == 404
    assert accepts == ["text/event-stream"]

    rounds_host.model.gate.set()
    expect(streaming).to_have_count(0)
    expect(page.locator("#messages .turn-steps.live")).to_have_count(0)
    reply = page.locator("#messages .message.assistant")
    expect(reply).to_have_count(1)
    thread = httpx.get(f"{rounds_host.url}/v1/threads/{THREAD}", timeout=30).json()
    committed = thread["messages"][-1]
    assert (thread["version"], committed["role"]) == (1, "assistant")
    expect(reply.locator(".text")).to_have_text(committed["content"])
    expect(reply.locator(".who")).to_have_text(f"assistant · {committed['turn_id']}")
    expect(page.locator("#messages .turn-steps .step")).to_contain_text("billing.balance")
    assert accepts == ["text/event-stream"]  # one delivery: no retry


def test_the_stop_button_stops_the_running_turn_at_its_next_safe_point(
    rounds_host: RoundsHost, page: Any
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{rounds_host.url}/console?thread={THREAD}")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_hidden()  # no turn runs
    page.get_by_label("Message").fill("look twice, slowly")
    page.get_by_role("button", name="Send").click()
    expect(stop).to_be_visible()
    with page.expect_response(lambda r: r.request.method == "DELETE") as asked:
        stop.click()
    assert asked.value.status == 200
    assert asked.value.json()["status"] == "requested"
    rounds_host.model.gate.set()
    reply = page.locator("#messages .message.assistant")
    expect(reply).to_contain_text("Cancelled before it finished: stopped from the console")
    expect(stop).to_be_hidden()
    thread = httpx.get(f"{rounds_host.url}/v1/threads/{THREAD}", timeout=30).json()
    assert thread["version"] == 1  # it committed what it did: no step
    assert thread["messages"][-1]["content"].endswith("stopped from the console")
    # The stream's cancelled event stays beside the turn's steps.
    note = page.locator("#messages .turn-steps .inbox-event.cancelled")
    expect(note).to_have_count(1)
    expect(note).to_contain_text("Cancelled before it finished: stopped from the console")


@dataclass
class BusyHost:
    """A host whose agent queues (``on_busy="queue"``), its thread busy: turn ``1``
    ("look twice, slowly") waits at the model's gate until :meth:`release`."""

    url: str
    turns: str
    model: RoundsModel
    held: threading.Thread

    def release(self) -> None:
        """Open the gate: the held turn goes on to its commit, then the inbox drains."""
        self.model.gate.set()
        self.held.join(60)


@pytest.fixture
def busy_host() -> Iterator[BusyHost]:
    model = RoundsModel()
    agent = replace(agents.billing_agent(FakeProvider()), interpreter=model, on_busy="queue")
    kernel = Kernel(agent, InMemoryDurability(), clock=lambda: NOW)
    with serving_in_thread(create_app(kernel)) as url:
        turns = f"{url}/v1/threads/{THREAD}/turns"
        assert httpx.post(turns, json={"turn_id": "0", "message": "hi"}, timeout=30).is_success
        held = threading.Thread(
            target=lambda: httpx.post(
                turns, json={"turn_id": "1", "message": "look twice, slowly"}, timeout=60
            )
        )
        held.start()
        busy = BusyHost(url, turns, model, held)
        try:
            assert model.slow.wait(30)
            yield busy
        finally:
            busy.release()  # a test that failed midway leaves no turn waiting


def test_a_message_sent_while_the_thread_is_busy_shows_it_waits_in_the_inbox(
    busy_host: BusyHost, page: Any
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{busy_host.url}/console?thread={THREAD}")
    page.get_by_label("Message").fill("and the blue one")
    page.get_by_role("button", name="Send").click()
    live = page.locator("#messages .turn-steps.live .inbox-event.queued")
    expect(live).to_have_count(1)
    expect(live).to_contain_text("waits in the inbox, place 1")
    busy_host.release()
    expect(page.locator("#messages .turn-steps.live")).to_have_count(0)
    thread = httpx.get(f"{busy_host.url}/v1/threads/{THREAD}", timeout=30).json()
    assert thread["version"] == 3 and not thread["inbox"]
    # Once it ran, its note stays beside its steps.
    kept = page.locator("#messages .turn-steps .inbox-event.queued")
    expect(kept).to_have_count(1)
    expect(kept).to_contain_text("waits in the inbox, place 1")


def test_a_threads_inbox_is_shown_and_a_message_can_be_removed_from_it(
    busy_host: BusyHost, page: Any
) -> None:
    from playwright.sync_api import expect

    for turn_id, text in (("2", "and the blue one"), ("3", "and the big one")):
        queued = httpx.post(busy_host.turns, json={"turn_id": turn_id, "message": text}, timeout=30)
        assert queued.status_code == 202, queued.text
    page.goto(f"{busy_host.url}/console?thread={THREAD}")
    inbox = page.locator("#inbox-list .queued")
    expect(inbox).to_have_count(2)
    expect(inbox.nth(0)).to_contain_text("queued · 2")
    expect(inbox.nth(0)).to_contain_text("and the blue one")
    expect(inbox.nth(1)).to_contain_text("and the big one")
    inbox.nth(0).get_by_role("button", name="Remove").click()
    expect(inbox).to_have_count(1)
    expect(inbox.nth(0)).to_contain_text("queued · 3")
    busy_host.release()
    for _ in range(300):  # the host drains the rest in the background
        thread = httpx.get(f"{busy_host.url}/v1/threads/{THREAD}", timeout=30).json()
        if not thread["inbox"]:
            break
        threading.Event().wait(0.05)
    assert thread["version"] == 3  # 0, 1 and 3: the removed message never ran
    assert [m["turn_id"] for m in thread["messages"] if m["role"] == "user"] == ["0", "1", "3"]


def schedule(host: Host, key: str, **when: Any) -> None:
    """Set a timer on the host's kernel (its store is one of this process)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(host.kernel.schedule(THREAD, key, **when))).result()


def test_a_threads_pending_timers_are_shown_earliest_first(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "what do I owe on invoice 42?")
    schedule(host, "follow-up", after=timedelta(days=2), message="ask whether 42 was paid")
    schedule(host, "summary", after=timedelta(days=1), every=timedelta(days=7))
    page.goto(f"{host.url}/console?thread={THREAD}")
    timers = page.locator("#timers-list .timer")
    expect(timers).to_have_count(2)
    expect(timers.nth(0)).to_contain_text("summary · due ")
    expect(timers.nth(0)).to_contain_text("every 168 h 0 min")
    expect(timers.nth(1)).to_contain_text("follow-up · due ")
    expect(timers.nth(1)).to_contain_text("ask whether 42 was paid")
    due = datetime.fromisoformat(
        httpx.get(f"{host.url}/v1/threads/{THREAD}/timers", timeout=30).json()["timers"][0][
            "due_at"
        ]
    )
    shown = page.evaluate("(iso) => new Date(iso).toLocaleString()", due.isoformat())
    expect(timers.nth(1)).to_contain_text(shown)  # the due time, as the browser writes it


def test_a_thread_without_timers_shows_no_timers_section(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "what do I owe on invoice 42?")
    page.goto(f"{host.url}/console?thread={THREAD}")
    expect(page.locator("#messages .message")).to_have_count(2)
    expect(page.locator("#timers")).to_be_hidden()


def test_a_deadline_shows_the_time_left_and_then_that_it_passed(
    rounds_host: RoundsHost, page: Any
) -> None:
    from playwright.sync_api import expect

    page.clock.set_fixed_time(NOW + timedelta(minutes=1))
    page.goto(f"{rounds_host.url}/console?thread={THREAD}")
    page.get_by_label("Message").fill("what do I owe, and pay it")
    page.get_by_role("button", name="Send").click()
    expires = page.locator("#confirmation-expires")
    expect(expires).to_contain_text("14 min 0 s left")
    timers = page.locator("#timers-list .timer")
    expect(timers).to_have_count(1)  # the kernel's own: the confirmation's expiry
    expect(timers.nth(0)).to_contain_text("kernel:expire:")
    expect(timers.nth(0)).to_contain_text("expires the pending confirmation")
    page.clock.set_fixed_time(NOW + timedelta(minutes=15, seconds=1))
    expect(expires).to_contain_text("overdue: an accept now runs nothing")


# -- answering: edits and reasons ------------------------------------------------------------


def turn_requests(page: Any) -> list[str]:
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.url.endswith("/turns") else None)
    return sent


def test_an_edit_that_breaks_the_schema_is_refused_in_the_page(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    sent = turn_requests(page)
    page.get_by_text("Edit the input before approving").click()
    edit = page.get_by_label("input (JSON)")
    held = json.loads(edit.input_value())
    assert held["amount_cents"] == 12500
    error = page.locator("#edit-error")
    for broken, why in [
        ({**held, "amount_cents": 0}, "amount_cents: must be more than 0"),
        ({**held, "amount_cents": "100"}, "amount_cents: must be integer, not string"),
        ({k: v for k, v in held.items() if k != "invoice_id"}, "invoice_id: required"),
    ]:
        edit.fill(json.dumps(broken))
        page.get_by_role("button", name="Approve edited input").click()
        expect(error).to_contain_text(why)
    edit.fill('{"amount_cents": 100')
    page.get_by_role("button", name="Approve edited input").click()
    expect(error).to_contain_text("invalid JSON")
    assert sent == []
    thread = httpx.get(f"{host.url}/v1/threads/{THREAD}", timeout=30).json()
    assert thread["version"] == 1 and thread["interaction"]["input"] == held
    assert host.charges() == []


def test_a_valid_edit_runs_the_edited_input(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    page.get_by_text("Edit the input before approving").click()
    edit = page.get_by_label("input (JSON)")
    edited = {**json.loads(edit.input_value()), "amount_cents": 10000}
    edit.fill(json.dumps(edited))
    page.get_by_role("button", name="Approve edited input").click()
    step = page.locator("#messages .step", has_text="payments.charge")
    expect(step.locator(".badge")).to_have_text("completed")
    expect(step).to_contain_text('edited: {"payment_intent_id":"pi_demo_42","amount_cents":10000')
    expect(page.locator("#messages")).to_contain_text("Charged $100.00 for invoice 42")
    expect(page.locator("#confirmation")).to_be_hidden()
    [charge] = host.charges()
    assert charge["amount_cents"] == 10000
    [fact] = [
        f
        for f in httpx.get(f"{host.url}/v1/threads/{THREAD}", timeout=30).json()["facts"]
        if f["key"] == "invoice.42.payment"
    ]
    assert fact["value"]["amount_cents"] == 10000


def test_a_reject_with_a_reason_shows_the_reason(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    page.get_by_label("reason").fill("the customer disputes invoice 42")
    page.get_by_role("button", name="Reject").click()
    step = page.locator("#messages .step", has_text="payments.charge")
    expect(step.locator(".badge")).to_have_text("rejected")
    expect(step.locator(".outcome")).to_have_text(
        "rejected by the person: the customer disputes invoice 42"
    )
    expect(page.locator("#confirmation")).to_be_hidden()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        events = pool.submit(lambda: asyncio.run(host.kernel.durability.read_outbox())).result()
    [resolved] = [e.payload for e in events if e.type == "interaction.resolved"]
    assert (resolved["resolution"], resolved["reason"]) == (
        "rejected",
        "the customer disputes invoice 42",
    )
    assert host.charges() == []


def test_an_answered_step_shows_who_answered(tmp_path: Path, page: Any) -> None:
    """The approver is the token's principal: the console shows it on the step the
    answer ran."""
    from playwright.sync_api import expect

    provider = opened_provider(tmp_path / "provider.db")
    kernel = Kernel(build_agent(provider), InMemoryDurability())
    tokens = {"tok-ana": Principal("ana@acme.example", None, "operator")}
    with serving_in_thread(create_app(kernel, tokens=tokens)) as url:
        proposed = httpx.post(
            f"{url}/v1/threads/{THREAD}/turns",
            json={"turn_id": "d1", "message": "pay invoice 42"},
            headers={"Authorization": "Bearer tok-ana"},
            timeout=30,
        )
        assert proposed.status_code == 200, proposed.text
        page.goto(f"{url}/console")
        page.get_by_label("Token").fill("tok-ana")
        page.get_by_label("Thread").fill(THREAD)
        page.get_by_role("button", name="Open").click()
        page.get_by_role("button", name="Accept").click()
        step = page.locator("#messages .step", has_text="payments.charge")
        expect(step.locator(".badge")).to_have_text("completed")
        expect(step.locator(".actor")).to_have_text("by ana@acme.example")


def quorum_agent(provider: FakePaymentProvider) -> Any:
    """The demo billing agent whose charges need two distinct approvers."""
    agent = build_agent(provider)
    capabilities = [
        replace(c, approvals=2) if c.id == "payments.charge" else c for c in agent.capabilities
    ]
    return replace(agent, capabilities=capabilities)


def test_a_quorum_shows_the_approvers_so_far_and_runs_after_the_second(
    tmp_path: Path, page: Any
) -> None:
    """``approvals=2``: the pending confirmation shows how many approvals it needs and
    who gave them; the queue says how many it has; the second principal's Accept runs it."""
    from playwright.sync_api import expect

    provider = opened_provider(tmp_path / "provider.db")
    kernel = Kernel(quorum_agent(provider), InMemoryDurability())
    tokens = {
        "tok-ana": Principal("ana@acme.example", None, "operator"),
        "tok-bob": Principal("bob@acme.example", None, "operator"),
    }
    with serving_in_thread(create_app(kernel, tokens=tokens)) as url:
        for turn_id, body in (
            ("d1", {"message": "pay invoice 42"}),
            ("d2", {"answer": {"decision": "accept"}}),
        ):
            sent = httpx.post(
                f"{url}/v1/threads/{THREAD}/turns",
                json={"turn_id": turn_id, **body},
                headers={"Authorization": "Bearer tok-ana"},
                timeout=30,
            )
            assert sent.status_code == 200, sent.text
        assert sent.json()["interaction"]["approved_by"] == ["ana@acme.example"]
        page.goto(f"{url}/console")
        page.get_by_label("Token").fill("tok-bob")
        page.get_by_role("button", name="Refresh").click()
        queued = page.locator("#queue-interactions .queue-item .capability")
        expect(queued).to_contain_text("1 of 2 approvals")
        page.get_by_label("Thread").fill(THREAD)
        page.get_by_role("button", name="Open").click()
        approvers = page.locator("#confirmation-approvers")
        expect(approvers).to_have_text("1 of 2 · approved by ana@acme.example")
        expect(page.locator("#confirmation-approvers-label")).to_be_visible()
        assert provider_charges(provider) == []
        page.get_by_role("button", name="Accept").click()
        step = page.locator("#messages .step", has_text="payments.charge")
        expect(step.locator(".badge")).to_have_text("completed")
        expect(step.locator(".actor")).to_have_text("by bob@acme.example")
        expect(page.locator("#confirmation")).to_be_hidden()
    assert [c["amount_cents"] for c in provider_charges(provider)] == [12500]


def test_a_receipt_to_reconcile_names_who_approved_its_write(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    provider = opened_provider(tmp_path / "provider.db")
    provider.simulate_lost_response("pi_demo_43")
    kernel = Kernel(build_agent(provider), InMemoryDurability())
    tokens = {"tok-ana": Principal("ana@acme.example", None, "operator")}
    with serving_in_thread(create_app(kernel, tokens=tokens)) as url:
        for turn_id, body in (
            ("d1", {"message": "pay invoice 43"}),
            ("d2", {"answer": {"decision": "accept"}}),
        ):
            sent = httpx.post(
                f"{url}/v1/threads/{THREAD}/turns",
                json={"turn_id": turn_id, **body},
                headers={"Authorization": "Bearer tok-ana"},
                timeout=30,
            )
            assert sent.status_code == 200, sent.text
        assert sent.json()["steps"][0]["status"] == "uncertain"
        page.goto(f"{url}/console")
        page.get_by_label("Token").fill("tok-ana")
        page.get_by_label("Thread").fill(THREAD)
        page.get_by_role("button", name="Open").click()
        receipt = page.locator(".receipt", has_text="payments.charge:charge:pi_demo_43")
        expect(receipt.locator(".error")).to_contain_text("approved by ana@acme.example")


def test_a_receipt_to_reconcile_shows_what_its_write_was(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    provider = opened_provider(tmp_path / "provider.db")
    provider.simulate_lost_response("pi_demo_43")
    kernel = Kernel(build_agent(provider), InMemoryDurability())
    with serving_in_thread(create_app(kernel)) as url:
        for turn_id, message in (("d1", "pay invoice 43"), ("d2", "yes")):
            sent = httpx.post(
                f"{url}/v1/threads/{THREAD}/turns",
                json={"turn_id": turn_id, "message": message},
                timeout=30,
            )
            assert sent.status_code == 200, sent.text
        page.goto(f"{url}/console?thread={THREAD}")
        receipt = page.locator(".receipt", has_text="payments.charge:charge:pi_demo_43")
        expect(receipt.locator(".write")).to_contain_text("for payments.charge {")
        expect(receipt.locator(".error")).to_contain_text("approved by anonymous")


def test_a_policy_shows_who_may_answer_and_the_proposer(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    provider = opened_provider(tmp_path / "provider.db")
    agent = build_agent(provider)
    capabilities = [
        replace(c, approvers=frozenset({"operator"}), self_approval=False)
        if c.id == "payments.charge"
        else c
        for c in agent.capabilities
    ]
    kernel = Kernel(replace(agent, capabilities=capabilities), InMemoryDurability())
    tokens = {
        "tok-ana": Principal("ana@acme.example", None, "user"),
        "tok-ops": Principal("ops@acme.example", None, "operator"),
    }
    with serving_in_thread(create_app(kernel, tokens=tokens)) as url:
        proposed = httpx.post(
            f"{url}/v1/threads/{THREAD}/turns",
            json={"turn_id": "d1", "message": "pay invoice 42"},
            headers={"Authorization": "Bearer tok-ana"},
            timeout=30,
        )
        assert proposed.status_code == 200, proposed.text
        page.goto(f"{url}/console")
        page.get_by_label("Token").fill("tok-ops")
        page.get_by_role("button", name="Refresh").click()
        queued = page.locator("#queue-interactions .queue-item .capability")
        expect(queued).to_contain_text("who may answer: a principal with the role 'operator'")
        page.get_by_label("Thread").fill(THREAD)
        page.get_by_role("button", name="Open").click()
        expect(page.locator("#confirmation-who")).to_have_text(
            "a principal with the role 'operator', other than the person who proposed it"
            " · proposed by ana@acme.example"
        )
        page.get_by_role("button", name="Accept").click()
        step = page.locator("#messages .step", has_text="payments.charge")
        expect(step.locator(".badge")).to_have_text("completed")
    assert [c["amount_cents"] for c in provider_charges(provider)] == [12500]


def test_one_approval_shows_no_approvers_line(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    host.turn("d1", "pay invoice 42")
    page.goto(f"{host.url}/console?thread={THREAD}")
    expect(page.locator("#confirmation-prompt")).to_be_visible()
    expect(page.locator("#confirmation-approvers")).to_be_hidden()
    expect(page.locator("#confirmation-approvers-label")).to_be_hidden()


def provider_charges(provider: FakePaymentProvider) -> list[dict[str, Any]]:
    """The charges the provider applied (from a worker thread: see opened_provider)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(provider.charges())).result()


def test_the_pages_schema_check_agrees_with_the_input_model(host: Host, page: Any) -> None:
    """The edit form's check runs in the page on a pydantic schema. The schema has what a
    capability's input model may hold. That is a nested model by ``$ref``, a literal, a
    list, an optional field, and bounds. The check refuses exactly what the model
    refuses. This holds on inputs where pydantic's coercion does not come in."""
    from typing import Literal

    import pydantic

    class Line(pydantic.BaseModel):
        sku: str = pydantic.Field(pattern=r"^sku-\d+$")
        cents: int = pydantic.Field(ge=1)

    class Order(pydantic.BaseModel):
        currency: Literal["usd", "eur"]
        lines: list[Line] = pydantic.Field(min_length=1)
        note: str | None = pydantic.Field(default=None, max_length=5)

    good_line = {"sku": "sku-1", "cents": 5}
    cases = [
        {"currency": "usd", "lines": [good_line]},
        {"currency": "eur", "lines": [good_line], "note": None, "extra": 1},
        {"currency": "gbp", "lines": [good_line]},
        {"currency": "usd", "lines": []},
        {"currency": "usd", "lines": [{"sku": "x-1", "cents": 5}]},
        {"currency": "usd", "lines": [{"sku": "sku-1", "cents": 0}]},
        {"currency": "usd", "lines": [{"sku": "sku-1"}]},
        {"currency": "usd", "lines": [good_line], "note": "too long"},
        {"lines": [good_line]},
    ]
    page.goto(f"{host.url}/console")
    schema = Order.model_json_schema()
    verdicts = page.evaluate(
        "([schema, cases]) => cases.map((c) => schemaProblems(schema, c, schema))",
        [schema, cases],
    )
    for case, problems in zip(cases, verdicts, strict=True):
        try:
            Order.model_validate(case)
            accepted = True
        except pydantic.ValidationError:
            accepted = False
        assert (problems == []) == accepted, (case, problems)
    assert verdicts[2] == ['currency: must be one of "usd", "eur"']
    assert verdicts[6] == ["lines[0].cents: required"]
    assert verdicts[7] == ["note: must have at most 5 characters"]
