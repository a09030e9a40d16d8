"""The AG-UI protocol: ``POST /v1/agui`` runs a turn as an AG-UI run.

`AG-UI <https://docs.ag-ui.com>`_ is the event protocol most agent front ends speak.
The body is AG-UI's ``RunAgentInput``.
The answer is its event stream.
It is built from the ``ag-ui-protocol`` package's own event types and ``EventEncoder``.

A run is one turn.
``threadId`` is the thread, and ``runId`` the turn ID.
A client may retry a run with the same ``runId``.
It then gets the committed turn again, and no write runs twice.
What the turn says comes from the end of the input:

- A ``resume`` entry answers the interrupt a previous run ended on.
  Its ``interruptId`` is the interaction's ID.
  ``messages`` are then ignored.
- Otherwise the last message decides.
  A ``user`` message is the turn's message.
  A ``tool`` message is the answer when its ``toolCallId`` names the confirmation's tool call.

An answer's ``payload`` is ``"accept"``, ``"reject"`` or an object.
The object is as the turn API's ``answer`` takes it.
A tool message's content serves as the payload, as JSON or a bare word.
The answer's actor is the token's principal, as on every turn.
A ``cancelled`` resume entry rejects the operation.
``state``, ``tools``, ``context`` and ``forwardedProps`` are accepted and ignored.
The kernel's state is its facts, and only capabilities write them.

The kernel's events map onto AG-UI's:

- Model text (``delta``) streams as ``TEXT_MESSAGE_*``.
  The committed reply's lines that the stream did not show follow as one more text message.
- Each finished step is a tool call.
  It sends ``TOOL_CALL_START``, ``ARGS``, ``END`` and ``TOOL_CALL_RESULT``.
  The result is the step as the turn API reports it.
  ``ARGS`` is the input the step ran with, as its receipt records it.
  That is the ``step`` event's ``input``.
  A step that ran nothing has the input its confirmation held, or no ``ARGS``.
- A confirmation opened by the turn is a tool call without a result.
  It is named :data:`CONFIRM_TOOL`.
  The run finishes with an ``interrupt`` outcome naming it.
  That is AG-UI's human-in-the-loop pattern.
- ``STATE_SNAPSHOT`` carries the thread's facts and version after the run.
- ``RUN_FINISHED`` carries the ``TurnResult`` JSON as its ``result``.

A turn may be refused before it ran anything.
That answers problem details with their status, as the turn API does.
A failure after the stream started is ``RUN_ERROR``.
Its ``code`` is the problem type's slug, and its ``rawEvent`` the problem details.
"""

from __future__ import annotations

try:
    from ag_ui.core import (
        PROTOCOL_VERSION,
        BaseEvent,
        Interrupt,
        RunAgentInput,
        RunErrorEvent,
        RunFinishedEvent,
        RunFinishedInterruptOutcome,
        RunFinishedSuccessOutcome,
        RunStartedEvent,
        StateSnapshotEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageStartEvent,
        TextPart,
        ToolCallArgsEvent,
        ToolCallEndEvent,
        ToolCallResultEvent,
        ToolCallStartEvent,
        ToolMessage,
        UserMessage,
    )
    from ag_ui.encoder import EventEncoder
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "the AG-UI endpoint needs the ag-ui-protocol package: pip install 'intention-kernel[agui]'",
        name=exc.name,
    ) from exc

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import pydantic
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from intention_kernel._interpretation import Answer
from intention_kernel._kernel import Kernel
from intention_kernel._streaming import TurnEvent
from intention_kernel._turns import check_client_turn_id
from intention_kernel._turnstream import (
    After,
    TurnStatus,
    decode_segment,
    parse_after,
    stream_store,
    watch_store,
)
from intention_kernel.durability._contract.records import StoredStream
from intention_kernel.errors import KernelError, SteerOrphanedError, ThreadBusyError
from intention_kernel.host._access import Principal
from intention_kernel.host._endpoints import REPLAYED_HEADER, Endpoints
from intention_kernel.host._problems import HostProblem, problem_body, problem_for
from intention_kernel.host._turnstreams import keep_alive
from intention_kernel.host._wire import AnswerBody, TurnBody, read_body

__all__ = ["CONFIRM_TOOL", "AgUiEndpoint", "RunTranslator", "turn_input"]

log = logging.getLogger("intention_kernel.host")

#: The name of the tool call that asks the person to confirm an operation.
CONFIRM_TOOL = "confirm"

#: A step still waiting for its answer: the confirmation's tool call stands for it.
_AWAITING = "awaiting_confirmation"

_PAYLOAD: pydantic.TypeAdapter[Literal["accept", "reject"] | AnswerBody] = pydantic.TypeAdapter(
    Literal["accept", "reject"] | AnswerBody
)


def _answer_schema() -> dict[str, Any]:
    """What an interrupt's answer may be (its ``responseSchema``), without the prose."""
    schema = _PAYLOAD.json_schema()
    for definition in schema.get("$defs", {}).values():
        definition.pop("description", None)
    return schema


ANSWER_SCHEMA = _answer_schema()


def turn_input(run: RunAgentInput, principal: Principal) -> tuple[str | None, Answer | None]:
    """The turn's message and answer in ``run``; ``HostProblem`` when it has none."""
    if run.resume:
        if len(run.resume) > 1:
            raise _invalid(["resume"], "a thread has one pending interrupt: send one resume entry")
        entry = run.resume[0]
        if entry.status == "cancelled":
            reason = "the person cancelled the interrupt"
            return None, Answer(entry.interrupt_id, "reject", reason=reason, actor=principal.actor)
        return None, _answer(entry.payload, entry.interrupt_id, principal, ["resume", 0, "payload"])
    if not run.messages:
        raise _invalid(["messages"], "a run needs a user message, a tool result or a resume")
    where: list[str | int] = ["messages", len(run.messages) - 1]
    last = run.messages[-1]
    if isinstance(last, UserMessage):
        return _text(last, where), None
    if isinstance(last, ToolMessage):
        if last.error is not None:
            answer = Answer(last.tool_call_id, "reject", reason=last.error, actor=principal.actor)
            return None, answer
        content = _tool_content(last, where)
        return None, _answer(content, last.tool_call_id, principal, [*where, "content"])
    raise _invalid(
        [*where, "role"],
        f"the last message's role is {last.role!r}: a run ends with the user's message or "
        f"the tool result of a {CONFIRM_TOOL!r} call, or sends resume",
    )


def _text(message: UserMessage, where: list[str | int]) -> str:
    """The message's text: its content, or its text parts one per line."""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for index, part in enumerate(message.content):
        if not isinstance(part, TextPart):
            raise _invalid(
                [*where, "content", index, "type"],
                f"a message's parts must be text; this agent cannot read a {part.type!r} part",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _tool_content(message: ToolMessage, where: list[str | int]) -> Any:
    """The tool message's answer: its content read as JSON, else the bare text."""
    if not isinstance(message.content, str):
        raise _invalid([*where, "content"], "a confirmation's tool result must be text (JSON)")
    try:
        return json.loads(message.content)
    except ValueError:
        return message.content.strip()


def _answer(payload: Any, interaction_id: str, principal: Principal, where: list[Any]) -> Answer:
    """``payload`` as the answer to ``interaction_id``, its actor the principal."""
    try:
        parsed = _PAYLOAD.validate_python(payload, strict=True)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        raise HostProblem(
            "invalid-request",
            'an answer is "accept", "reject" or an object with a decision: '
            + "; ".join(
                f"{'.'.join(map(str, [*where, *e['loc']]))}: {e['msg']}" for e in errors[:3]
            ),
            errors=[
                {"loc": [*where, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in errors
            ],
        ) from None
    if isinstance(parsed, AnswerBody) and parsed.interaction_id not in (None, interaction_id):
        raise _invalid(
            [*where, "interaction_id"],
            f"the answer names interaction {parsed.interaction_id!r}, "
            f"but it answers {interaction_id!r}",
        )
    answer = TurnBody(answer=parsed).resolved_answer(principal.actor)
    assert answer is not None
    return dataclasses.replace(answer, interaction_id=interaction_id)


def _invalid(loc: list[Any], detail: str) -> HostProblem:
    """A 422 ``invalid-request`` about the body's field at ``loc``."""
    where = ".".join(map(str, loc))
    return HostProblem(
        "invalid-request",
        f"{where}: {detail}",
        errors=[{"loc": loc, "msg": detail, "type": "value_error"}],
    )


def _now() -> int:
    """Milliseconds since the epoch, as every AG-UI SDK stamps its events."""
    return time.time_ns() // 1_000_000


class RunTranslator:
    """Turns the kernel's events of one turn into the AG-UI events of one run.

    It keeps what the run has shown:

    - the open text message.
    - the text streamed last.
    - the steps already shown as tool calls.
    - the inputs the kernel reported.
    """

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        input_schemas: dict[str, dict[str, Any]],
        parent_run_id: str | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self._input_schemas = input_schemas
        self._count = 0
        self._open: str | None = None  # the text message being streamed
        self._last_message: str | None = None
        self._streamed = ""  # the text of the last streamed message
        self._carry = False  # the next message goes on with the last one's text
        self._shown: set[str] = set()  # step IDs shown as tool calls
        self._inputs: dict[str, dict[str, Any]] = {}  # step ID → input, where reported
        self._ran: dict[str, Any] = {}  # step ID → the input its receipt records

    def started(self) -> list[BaseEvent]:
        return [
            RunStartedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                parent_run_id=self.parent_run_id,
                protocol_version=PROTOCOL_VERSION,
                timestamp=_now(),
            )
        ]

    def translate(self, event: TurnEvent) -> list[BaseEvent]:
        """The AG-UI events for one kernel event (several, or none)."""
        if event.type == "delta":
            return self._delta(event.data["text"])
        if event.type == "step":
            return [*self._close(), *self._step(event.data)]
        if event.type == "interaction":
            # Shown at the end, if it is still the pending one.
            # A later step of the same turn may supersede it.
            self._inputs[event.data["step_id"]] = event.data["input"]
            return []
        return self._finished(event.data)

    def unknown_inputs(self, result: dict[str, Any]) -> dict[str, tuple[str, ...]]:
        """The result's steps still to show whose input no event gave.

        It maps each step ID to the IDs of its receipts.
        A write's receipt records its input.
        """
        return {
            step["step_id"]: tuple(step["receipt_ids"])
            for step in result["steps"]
            if step["step_id"] not in self._shown and step["receipt_ids"]
        }

    def receipt_input(self, step_id: str, input: Any) -> None:
        """The input ``step_id`` ran with, as its receipt records it."""
        self._ran[step_id] = input

    def resumed(self) -> None:
        """The events so far were shown on a lost connection.

        A text message open there goes on here as a new one, with the same text so far.
        """
        if self._open is not None:
            self._open = None
            self._carry = True

    def failed(self, problem: HostProblem) -> list[BaseEvent]:
        """The run's end when the turn failed: nothing was committed."""
        body = problem_body(problem)
        return [
            RunErrorEvent(
                message=problem.detail, code=problem.type.slug, raw_event=body, timestamp=_now()
            )
        ]

    def _id(self, kind: str) -> str:
        self._count += 1
        return f"{self.run_id}-{kind}{self._count}"

    def _delta(self, text: str) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        if self._open is None:
            self._open = self._last_message = self._id("m")
            if not self._carry:
                self._streamed = ""
            self._carry = False
            events.append(
                TextMessageStartEvent(message_id=self._open, role="assistant", timestamp=_now())
            )
        self._streamed += text
        events.append(TextMessageContentEvent(message_id=self._open, delta=text, timestamp=_now()))
        return events

    def _close(self) -> list[BaseEvent]:
        if self._open is None:
            return []
        message_id, self._open = self._open, None
        return [TextMessageEndEvent(message_id=message_id, timestamp=_now())]

    def _text(self, text: str) -> list[BaseEvent]:
        """One whole text message."""
        return [*self._delta(text), *self._close()]

    def _step(self, step: dict[str, Any]) -> list[BaseEvent]:
        step_id = step["step_id"]
        if step["status"] == _AWAITING or step_id in self._shown:
            return []
        self._shown.add(step_id)
        step = dict(step)
        known = step.pop("input", None)  # the result's content is the step as committed
        if known is None:  # a replay's step, or one that ran nothing
            known = self._ran.get(step_id)
        if known is None:
            known = step.get("approved_input") or self._inputs.get(step_id)
        return [
            *self._call(step_id, step["capability_id"], known),
            ToolCallResultEvent(
                message_id=self._id("r"),
                tool_call_id=step_id,
                content=json.dumps(step, ensure_ascii=False),
                role="tool",
                timestamp=_now(),
            ),
        ]

    def _call(self, call_id: str, name: str, args: Any) -> list[BaseEvent]:
        events: list[BaseEvent] = [
            ToolCallStartEvent(
                tool_call_id=call_id,
                tool_call_name=name,
                parent_message_id=self._last_message,
                timestamp=_now(),
            )
        ]
        if args is not None:
            delta = json.dumps(args, ensure_ascii=False)
            events.append(ToolCallArgsEvent(tool_call_id=call_id, delta=delta, timestamp=_now()))
        events.append(ToolCallEndEvent(tool_call_id=call_id, timestamp=_now()))
        return events

    def _finished(self, result: dict[str, Any]) -> list[BaseEvent]:
        events = self._close()
        for step in result["steps"]:  # a replay reports its steps only here
            events += self._step(step)
        reply: str = result["reply"]
        if self._streamed and reply.startswith(self._streamed):
            reply = reply[len(self._streamed) :].lstrip("\n")
        if reply:
            events += self._text(reply)
        interaction = result["interaction"]
        outcome: RunFinishedInterruptOutcome | RunFinishedSuccessOutcome
        if interaction is None:
            outcome = RunFinishedSuccessOutcome()
        else:
            if interaction["turn_id"] == self.run_id:
                # Opened by this turn: the front end has not seen its tool call yet.
                events += self._call(
                    interaction["id"], CONFIRM_TOOL, self._confirmation(interaction)
                )
            outcome = RunFinishedInterruptOutcome(interrupts=[self._interrupt(interaction)])
        return [
            *events,
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                result=result,
                outcome=outcome,
                timestamp=_now(),
            ),
        ]

    def _confirmation(self, interaction: dict[str, Any]) -> dict[str, Any]:
        """The confirmation tool call's arguments.

        They are the interaction as the thread view shows it.
        They include the schema of the input an accept may edit.
        """
        schema = None
        if interaction["kind"] == "confirmation":
            schema = self._input_schemas.get(interaction["capability_id"])
        return {**interaction, "input_schema": schema}

    def _interrupt(self, interaction: dict[str, Any]) -> Interrupt:
        return Interrupt(
            id=interaction["id"],
            reason=interaction["kind"],
            message=interaction["prompt"],
            tool_call_id=interaction["id"],
            response_schema=ANSWER_SCHEMA,
            expires_at=interaction["expires_at"],
            metadata={
                "capability_id": interaction["capability_id"],
                "digest": interaction["digest"],
            },
        )


class AgUiEndpoint:
    """``POST /v1/agui``, for the kernel and access policy of ``api``."""

    def __init__(self, api: Endpoints) -> None:
        self.api = api
        self._input_schemas = {c.id: c.input_schema for c in api.kernel.agent.capabilities}
        # The tasks that deliver a retried run's turn again: kept until they end.
        self._drivers: set[asyncio.Task[BaseException | None]] = set()

    async def post(self, request: Request) -> Response:
        principal = self.api.access.authenticate(request)
        run = await read_body(request, RunAgentInput)
        message, answer = turn_input(run, principal)
        thread_id, turn_id = run.thread_id, run.run_id
        after = request.headers.get("last-event-id") or None
        translator = RunTranslator(thread_id, turn_id, self._input_schemas, run.parent_run_id)
        try:
            # As in the turn API's stream, a turn refused before it ran anything
            # answers problem details with its status, not a run that only says so.
            first, events, replayed = await self._events(
                translator, message, answer, principal, after
            )
        except KernelError as error:
            raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
        encoder = EventEncoder(accept=request.headers.get("accept", ""))
        every = self.api.keep_alive  # a waiting run pings: a proxy keeps it open
        return StreamingResponse(
            keep_alive(self._encoded(encoder, translator, first, events, principal), every),
            media_type=encoder.get_content_type(),
            headers={
                REPLAYED_HEADER: "true" if replayed else "false",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            },
        )

    async def _events(
        self,
        translator: RunTranslator,
        message: str | None,
        answer: Answer | None,
        principal: Principal,
        after: str | None,
    ) -> tuple[TurnEvent, AsyncIterator[TurnEvent], bool]:
        """The run's kernel events after ``after``.

        It returns the first, the rest, and whether the turn was committed before.
        A new run runs its turn.
        A run's turn may be recorded already.
        That is a retry of a run whose connection, or process, was lost.
        Such a run is read from the turn's stream, so nothing runs twice.
        The events before ``after`` only prime ``translator``.
        """
        kernel, thread_id, turn_id = self.api.kernel, translator.thread_id, translator.run_id
        # A run delivers a turn: a reserved ID is refused before its status is read,
        # which a timer's or an expiry's turn ID passes (readable, not deliverable).
        check_client_turn_id(turn_id)
        position = parse_after(after)  # a bad Last-Event-ID: 422 before anything runs
        if position is not None and position.end:
            position = None  # the client saw the whole run: it gets the whole run again
        ran = kernel.stream_turn(thread_id, turn_id, message, answer, principal=principal)
        status = await self._status(thread_id, turn_id, principal)
        if status is None or status.status not in ("running", "committed"):
            first = await anext(ran)  # a new run, or a store without turn streams
            replayed = first.type == "result" and first.data.get("replayed") is True
            if position is None:
                return first, ran, replayed
            return *await _primed(translator, position, _chained(first, ran)), replayed
        if status.status == "committed":
            await anext(ran)  # the conflict check: the same run ID, another input
            await ran.aclose()
            followed = _recorded(kernel, translator, principal)
        else:
            # Running here, in another process, or in one that died.
            # This process delivers it again.
            # That waits for a live holder's commit and replays it.
            # Or it goes on from the recorded rounds.
            # The stream follows the record.
            await ran.aclose()  # never started: each attempt makes its own

            def deliver() -> AsyncIterator[TurnEvent]:
                return kernel.stream_turn(thread_id, turn_id, message, answer, principal=principal)

            driver = asyncio.create_task(_drained(deliver))
            self._drivers.add(driver)
            driver.add_done_callback(self._drivers.discard)
            store = stream_store(kernel.durability)
            followed = _follow(store, translator, principal, driver)
        committed = status.status == "committed"
        return *await _primed(translator, position, followed), committed

    async def _status(
        self, thread_id: str, turn_id: str, principal: Principal
    ) -> TurnStatus | None:
        """The turn's status; ``None`` on a store that keeps no turn streams."""
        if stream_store(self.api.kernel.durability) is None:
            return None
        return await self.api.kernel.turn_status(thread_id, turn_id, principal=principal)

    async def _encoded(
        self,
        encoder: EventEncoder,
        translator: RunTranslator,
        first: TurnEvent,
        rest: AsyncIterator[TurnEvent],
        principal: Principal,
    ) -> AsyncIterator[str]:
        thread_id, turn_id = translator.thread_id, translator.run_id
        for event in translator.started():
            yield encoder.encode(event)
        try:
            current: TurnEvent | None = first
            while current is not None:
                if current.type == "result":
                    await self._receipt_inputs(translator, current.data)
                outs = translator.translate(current)
                for index, out in enumerate(outs):
                    if isinstance(out, RunFinishedEvent):
                        for snapshot in await self._snapshot(principal, thread_id):
                            yield encoder.encode(snapshot)
                        out = out.model_copy(update={"timestamp": _now()})
                    # The last frame of a kernel event carries its ID.
                    # A client that lost the stream resumes after it (``Last-Event-ID``).
                    last = index == len(outs) - 1
                    yield _with_id(encoder.encode(out), current.id if last else None)
                current = await anext(rest, None)
        except KernelError as error:
            problem = problem_for(error, thread_id=thread_id, turn_id=turn_id)
            log.warning("AG-UI run %r of thread %r failed: %s", turn_id, thread_id, problem.detail)
            for out in translator.failed(problem):
                yield encoder.encode(out)
        except Exception:
            log.exception("AG-UI run %r of thread %r failed", turn_id, thread_id)
            detail = "an unexpected error occurred; see the server log"
            problem = HostProblem("internal-error", detail, thread_id=thread_id, turn_id=turn_id)
            for out in translator.failed(problem):
                yield encoder.encode(out)

    async def _receipt_inputs(self, translator: RunTranslator, result: dict[str, Any]) -> None:
        """Tell ``translator`` the inputs of the result's writes that no event gave.

        That happens on a replay from the result alone.
        The inputs are as their receipts record them.
        """
        wanted = translator.unknown_inputs(result)
        if not wanted:
            return
        try:
            receipts = await self.api.kernel.durability.list_receipts(
                thread_id=translator.thread_id
            )
        except KernelError as error:
            log.warning("AG-UI run %r: no receipt inputs: %s", translator.run_id, error)
            return
        inputs = {r.id: r.input for r in receipts if r.input is not None}
        for step_id, receipt_ids in wanted.items():
            found = [inputs[id] for id in receipt_ids if id in inputs]
            if found:
                translator.receipt_input(step_id, found[0])

    async def _snapshot(self, principal: Principal, thread_id: str) -> list[BaseEvent]:
        """The thread's facts and version, read after the turn committed.

        It gives none when the read fails.
        The turn is committed, and the run must not say it failed.
        """
        try:
            checkpoint = await self.api.access.load_checkpoint(principal, thread_id)
        except KernelError as error:
            log.warning("AG-UI run on thread %r: no state snapshot: %s", thread_id, error)
            return []
        if checkpoint is None:
            return []
        facts = {key: checkpoint.facts[key].value for key in sorted(checkpoint.facts)}
        snapshot = {"version": checkpoint.version, "facts": facts}
        return [StateSnapshotEvent(snapshot=snapshot, timestamp=_now())]


def _with_id(frame: str, event_id: str | None) -> str:
    """An encoded SSE frame with an ``id:`` line.

    An event ID is one line of letters, digits and dots.
    """
    if event_id is None or not frame.endswith("\n\n"):
        return frame
    return f"{frame[:-1]}id: {event_id}\n\n"


async def _chained(first: TurnEvent, rest: AsyncIterator[TurnEvent]) -> AsyncIterator[TurnEvent]:
    yield first
    async for event in rest:
        yield event


def _recorded(
    kernel: Kernel, translator: RunTranslator, principal: Principal
) -> AsyncIterator[TurnEvent]:
    """The turn's recorded stream from its start, read from the store."""
    thread_id, turn_id = translator.thread_id, translator.run_id
    return kernel.watch_turn(thread_id, turn_id, principal=principal)


async def _segments(store: Any, thread_id: str, turn_id: str) -> list[TurnEvent]:
    """Every event of the turn's recorded segments, in order."""
    found: StoredStream = await store.read_stream(thread_id, turn_id)
    return [event for _, text in found.segments for event in decode_segment(text)[1]]


async def _drained(deliver: Callable[[], AsyncIterator[TurnEvent]]) -> BaseException | None:
    """Deliver the turn and read its stream to the end, and return its error or ``None``.

    A busy thread is tried again.
    Its holder commits the turn, or dies and lets go.
    An orphaned steer is not: only its taker's redelivery ends it.
    """
    while True:
        try:
            async for _ in deliver():
                pass
        except SteerOrphanedError as error:
            return error
        except ThreadBusyError:
            await asyncio.sleep(0.5)
            continue
        except Exception as error:
            return error
        return None


async def _follow(
    store: Any,
    translator: RunTranslator,
    principal: Principal,
    driver: asyncio.Task[BaseException | None],
) -> AsyncIterator[TurnEvent]:
    """The turn's recorded stream until its ``result``, as ``watch_turn`` reads it.

    The driver's error ends it, after the rest of what the store recorded.
    """
    thread_id, turn_id = translator.thread_id, translator.run_id
    failure: list[BaseException] = []

    def wake() -> asyncio.Event | None:
        # Checked before each read of the store: no task is ever cancelled mid-read.
        if driver.done() and (error := driver.result()) is not None:
            failure.append(error)
            raise _DriverFailed
        return None

    last: str | None = None
    try:
        async for event in watch_store(
            store, thread_id, turn_id, None, tenant_id=principal.tenant_id, poll=0.1, wake=wake
        ):
            last = event.id
            yield event
        return
    except _DriverFailed:
        pass
    position = parse_after(last)
    for event in await _segments(store, thread_id, turn_id):
        if position is None or position.before(event):
            yield event
    raise failure[0]


class _DriverFailed(Exception):
    """The delivery a followed run drives failed: no result will come."""


async def _primed(
    translator: RunTranslator, position: After | None, events: AsyncIterator[TurnEvent]
) -> tuple[TurnEvent, AsyncIterator[TurnEvent]]:
    """The first event after ``position``, and the rest.

    The events up to it go through ``translator`` unsent.
    So it knows what the client was shown.
    """
    async for event in events:
        if position is None or position.before(event):
            translator.resumed()
            return event, events
        translator.translate(event)
    raise RuntimeError("a turn's stream ended without its result")  # pragma: no cover
