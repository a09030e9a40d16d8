"""Compilation rejects bad agent definitions; fingerprints are stable."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    CompilationError,
    Kernel,
    Rule,
    RuleInterpreter,
    capability,
)
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent


def _agent(*caps: Any, version: str = "1") -> Agent:
    return Agent("a", version, list(caps), ScriptedInterpreter({}))


@capability("things.read")
async def read_things(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
    return CapabilityResult()


def test_write_capability_with_confirmation_none_is_rejected() -> None:
    @capability("things.write", effect="write", confirmation="none")
    async def write(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    with pytest.raises(CompilationError, match="confirmation='none'") as caught:
        Kernel(_agent(write), InMemoryDurability())
    assert len(caught.value.problems) == 1


def test_duplicate_and_malformed_ids_are_all_reported() -> None:
    @capability("Things", description="bad id")
    async def bad(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    with pytest.raises(CompilationError) as caught:
        Kernel(_agent(read_things, read_things, bad), InMemoryDurability())
    problems = " | ".join(caught.value.problems)
    assert "duplicate capability ID 'things.read'" in problems
    assert "'Things' must look like 'area.action'" in problems


def test_capability_records_only_and_compilation_reports_a_sync_handler() -> None:
    @capability("things.sync")  # type: ignore[arg-type]
    def sync(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    with pytest.raises(CompilationError, match="must be an async function"):
        Kernel(_agent(sync), InMemoryDurability())


def test_defaults_read_none_write_required() -> None:
    @capability("things.write", effect="write")
    async def write(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    assert read_things.confirmation == "none"
    assert write.confirmation == "required"


def test_pydantic_input_model_is_detected_and_exposed_as_json_schema() -> None:
    class In(pydantic.BaseModel):
        n: int

    @capability("things.count")
    async def count(input: In, ctx: CapabilityContext) -> None:
        return None

    assert count.input_model is In
    assert count.input_schema["properties"]["n"]["type"] == "integer"
    assert read_things.input_schema == {"type": "object"}


def test_fingerprint_is_stable_and_changes_with_the_definition() -> None:
    provider = FakeProvider()
    a = Kernel(billing_agent(provider), InMemoryDurability()).fingerprint
    b = Kernel(billing_agent(provider), InMemoryDurability()).fingerprint
    c = Kernel(billing_agent(provider, version="2"), InMemoryDurability()).fingerprint
    assert a == b != c
    assert a.startswith("sha256:")


class _Amount(pydantic.BaseModel):
    amount: int


class _AmountAsText(pydantic.BaseModel):
    amount: str


def _change_capability(
    confirmation: Any = "required", *, effect: Any = "write", model: type | None = None
) -> Any:
    if model is None:

        @capability("things.change", effect=effect, confirmation=confirmation)
        async def change(input: dict[str, Any], ctx: CapabilityContext) -> None:
            return None

        return change

    @capability("things.change", effect=effect, confirmation=confirmation)
    async def typed(input: model, ctx: CapabilityContext) -> None:  # type: ignore[valid-type]
        return None

    return typed


def _fingerprint(*caps: Any) -> str:
    return Kernel(_agent(*caps), InMemoryDurability()).fingerprint


def test_fingerprint_changes_with_a_capabilitys_effect_confirmation_or_input_schema() -> None:
    base = _fingerprint(read_things, _change_capability(model=_Amount))
    assert _fingerprint(read_things, _change_capability(effect="read", model=_Amount)) != base
    assert _fingerprint(read_things, _change_capability("capability", model=_Amount)) != base
    assert _fingerprint(read_things, _change_capability(model=_AmountAsText)) != base
    assert (
        _fingerprint(read_things, _change_capability()) != base
    )  # a dict input has another schema
    assert _fingerprint(read_things, _change_capability(model=_Amount)) == base


def test_fingerprint_does_not_depend_on_the_order_of_capabilities() -> None:
    change = _change_capability(model=_Amount)
    assert _fingerprint(read_things, change) == _fingerprint(change, read_things)


def test_a_rule_naming_a_capability_the_agent_lacks_is_refused_at_compilation() -> None:
    rules = RuleInterpreter(
        [
            Rule(r"^yes\b", answer="accept"),
            Rule(r"things", capability_id="things.read"),
            Rule(r"refund", capability_id="things.refund"),
        ]
    )
    with pytest.raises(CompilationError) as caught:
        Kernel(Agent("a", "1", [read_things], rules), InMemoryDurability())
    assert caught.value.problems == [
        "rule 'refund' names capability 'things.refund', which the agent does not have "
        "(it has: things.read)"
    ]
    Kernel(Agent("a", "1", [read_things], RuleInterpreter(rules.rules[:2])), InMemoryDurability())
