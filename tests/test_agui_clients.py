"""The AG-UI endpoint from real clients: a browser, and the protocol's own client.

- ``examples/agui/index.html`` in headless Chromium (Debian's, driven by Playwright),
  served by the host on the API's origin. The page POSTs a ``RunAgentInput`` and
  renders the stream as it arrives: the test holds the model mid-sentence and sees
  the first words on the page before the run ends. It then accepts the
  confirmation from the page, and the charge runs once.
- The official TypeScript client, ``@ag-ui/client``'s ``HttpAgent``, under Node
  (``tests/agui_client/run.mjs``): it verifies every event against the protocol,
  and resumes the interrupt with its own ``buildResumeArray``.

Without /usr/bin/chromium, the playwright package, Node or the client's packages
(``npm ci --prefix tests/agui_client``) the tests skip with the reason, unless
INTENTION_KERNEL_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.agui import page_app

from conftest import service_unavailable
from host_support import serving_in_thread
from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent, billing_interpreter

# One xdist worker runs this module, so its browser (a module fixture) starts once.
pytestmark = pytest.mark.xdist_group("agui-clients")

CHROMIUM = Path("/usr/bin/chromium")
CLIENT = Path(__file__).parent / "agui_client"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


class HeldMidSentence:
    """Streams ``You owe``, waits for the test's go, then finishes the sentence;
    any other message goes to the billing agent's scripted interpreter."""

    multi_round = False

    def __init__(self) -> None:
        self.go = threading.Event()  # set by the test's thread
        self.scripted = billing_interpreter()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if request.message != "what do I owe?":
            return await self.scripted.interpret(request)
        assert request.stream is not None
        request.stream("You owe ")
        await asyncio.to_thread(self.go.wait, 30)
        request.stream("7.")
        return Interpretation(reply="You owe 7.", intents=[Intent("billing.balance", {"due": 7})])


@dataclasses.dataclass
class Host:
    url: str
    provider: FakeProvider
    interpreter: HeldMidSentence


@pytest.fixture
def host() -> Iterator[Host]:
    provider = FakeProvider()
    interpreter = HeldMidSentence()
    agent = dataclasses.replace(billing_agent(provider), interpreter=interpreter)
    with serving_in_thread(page_app(Kernel(agent, InMemoryDurability()))) as url:
        yield Host(url, provider, interpreter)
    interpreter.go.set()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        service_unavailable("Chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        service_unavailable("Playwright", f"the playwright package is not installed: {exc}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"the page raised in the browser: {errors}"


def say(page: Any, text: str) -> None:
    page.fill("#text", text)
    page.click("#send button")


def test_the_page_renders_streamed_text_before_the_run_ends(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(host.url + "/")
    say(page, "what do I owe?")

    reply = page.locator(".assistant").first
    expect(reply).to_have_text("You owe ")  # streamed: the model is still held
    assert page.locator(".tool").count() == 0
    host.interpreter.go.set()
    expect(reply).to_have_text("You owe 7.")
    expect(page.locator(".tool")).to_have_text("billing.balance → completed")
    expect(page.locator("#facts")).to_contain_text('"balance": 7')


def test_a_confirmation_accepted_in_the_page_charges_once(host: Host, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(host.url + "/")
    say(page, "charge pi_1 7")

    interrupt = page.locator(".interrupt")
    expect(interrupt).to_contain_text("pi_1")
    assert host.provider.calls() == 0
    interrupt.get_by_role("button", name="Accept").click()

    expect(page.locator(".tool")).to_have_text("payments.charge → completed")
    expect(page.locator("#facts")).to_contain_text("charge.pi_1")
    assert host.provider.calls() == 1
    assert page.locator(".interrupt").count() == 0


def run_client(url: str) -> dict[str, Any]:
    """``tests/agui_client/run.mjs`` against ``url``: what the client made of the runs."""
    node = shutil.which("node")
    if node is None:
        service_unavailable("Node", "node is not on PATH (apt-get install nodejs npm)")
    if not (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir():
        service_unavailable("@ag-ui/client", f"not installed: npm ci --prefix {CLIENT}")
    done = subprocess.run(
        [str(node), str(CLIENT / "run.mjs"), url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # the client warns of what it could not apply
    output: dict[str, Any] = json.loads(done.stdout)
    return output


def test_the_official_client_runs_resumes_and_retries_without_a_second_charge() -> None:
    provider = FakeProvider()
    app = page_app(Kernel(billing_agent(provider), InMemoryDurability()))
    with serving_in_thread(app) as url:
        seen = run_client(url)
        assert provider.calls() == 1
        retried = run_client(url)  # the same run IDs again: both runs replay
    assert provider.calls() == 1

    first, second = seen["first"], seen["second"]
    [interrupt] = first["pendingInterrupts"]
    assert interrupt["message"] == "Charge 7 to pi_1?"
    [said, asked] = first["messages"]
    assert said["content"] == "charge pi_1 7"
    assert asked["content"] == "Charge 7 to pi_1?"
    [call] = asked["toolCalls"]
    assert (call["id"], call["function"]["name"]) == (interrupt["id"], "confirm")
    assert json.loads(call["function"]["arguments"])["input"] == {
        "payment_intent_id": "pi_1",
        "amount": 7,
    }
    assert second["pendingInterrupts"] == []
    assert second["state"]["facts"]["charge.pi_1"]["amount"] == 7
    step = json.loads(second["messages"][-2]["content"])
    assert (step["capability_id"], step["status"]) == ("payments.charge", "completed")
    assert second["messages"][-1]["content"] == "Charged 7 to pi_1."
    assert retried["second"]["messages"] == second["messages"]
    assert retried["first"]["pendingInterrupts"] == first["pendingInterrupts"]
