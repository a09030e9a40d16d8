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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import service_unavailable
from host_support import opened_provider, serving_in_thread
from intention_kernel import Kernel
from intention_kernel.demo import FakePaymentProvider, build_agent
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability, faults
from visual_support import DEJAVU, compare, pinned_fontconfig, save_baseline

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

    def turn(self, turn_id: str, message: str) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/v1/threads/{THREAD}/turns",
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
        yield Host(url, provider)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not CHROMIUM.exists():
        service_unavailable("Chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        service_unavailable("Playwright", f"the playwright package is not installed: {exc}")
    env = dict(os.environ)
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
    expect(page.locator("#steps")).to_contain_text("payments.charge")
    expect(page.locator("#steps .badge.completed")).to_have_text("completed")
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
    expect(page.locator("#steps .badge.rejected")).to_have_text("rejected")
    expect(page.locator("#steps")).to_contain_text("payments.charge")
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
