"""The host's OpenAPI 3.1 document, served at ``/openapi.json``.

Request and response schemas are generated from the very models the host uses.
Those are the models it validates with, and the kernel types it serializes.
They live in :mod:`._wire` and ``TurnResult``.
So the document cannot promise what the host does not do.
Paths, parameters and problem responses are declared here, next to each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pydantic

from intention_kernel._effects import Receipt, ReceiptStatus
from intention_kernel._ids import MAX_ID_LENGTH
from intention_kernel._inbox import Cancellation, Queued
from intention_kernel._interpretation import MAX_ANSWER_TEXT
from intention_kernel._turns import TurnResult
from intention_kernel._turnstream import TurnStatus
from intention_kernel.host._problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPES
from intention_kernel.host._wire import (
    Health,
    InteractionList,
    ReceiptList,
    ResolveBody,
    ThreadView,
    TimerList,
    TurnBody,
)

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{model}"
_MODELS: tuple[tuple[str, Any, pydantic.json_schema.JsonSchemaMode], ...] = (
    ("TurnBody", TurnBody, "validation"),
    ("ResolveBody", ResolveBody, "validation"),
    ("TurnResult", TurnResult, "serialization"),
    ("ThreadView", ThreadView, "serialization"),
    ("TimerList", TimerList, "serialization"),
    ("ReceiptList", ReceiptList, "serialization"),
    ("InteractionList", InteractionList, "serialization"),
    ("Receipt", Receipt, "serialization"),
    ("Health", Health, "serialization"),
    ("Cancellation", Cancellation, "serialization"),
    ("Queued", Queued, "serialization"),
    ("TurnStatus", TurnStatus, "serialization"),
)

ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH, "pattern": r"^[^\x00]*$"}

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Problem details (RFC 9457). `type` is stable; see /problems/{slug}.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "enum": [t.uri for t in PROBLEM_TYPES.values()]},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "thread_id": {"type": "string"},
        "turn_id": {"type": "string"},
        "key": {"type": "string"},
        "taken_by": {
            "type": "string",
            "description": "steer-orphaned: the turn ID to deliver again.",
        },
        "errors": {
            "type": "array",
            "description": "Validation errors, one per problem in the request.",
            "items": {
                "type": "object",
                "required": ["loc", "msg", "type"],
                "properties": {
                    "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                    "msg": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
}

#: What the request guard answers on any path.
#: A Host the app does not serve gets 400.
#: A browser request from another origin without a token gets 403.
GUARD_STATUSES = (400, 403)

PROBLEM_TYPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "description"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "description": {"type": "string"},
    },
}


def openapi_document(
    *, version: str, agent: str, max_message_chars: int, auth: bool
) -> dict[str, Any]:
    """The document for one app; ``auth`` adds the bearer scheme and 401 responses."""
    schemas = _component_schemas(max_message_chars)
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["ProblemType"] = PROBLEM_TYPE_SCHEMA
    api = _Api(auth)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "intention-kernel host",
            "version": version,
            "description": (
                f"Durable turns of the agent {agent!r}. A turn ID identifies one delivery: "
                "resend the same request with the same turn ID after any failure and you get "
                "the stored result (Idempotency-Replayed: true); nothing runs twice."
            ),
        },
        "paths": {
            "/v1/threads/{thread_id}/turns": {"post": api.post_turn()},
            "/v1/threads/{thread_id}/turns/{turn_id}": {
                "get": api.get_turn(),
                "delete": api.cancel_turn(),
            },
            "/v1/threads/{thread_id}/turns/{turn_id}/events": {"get": api.get_turn_events()},
            "/v1/threads/{thread_id}/timers": {"get": api.get_timers()},
            "/v1/threads/{thread_id}": {"get": api.get_thread()},
            "/v1/receipts": {"get": api.list_receipts()},
            "/v1/interactions": {"get": api.list_interactions()},
            "/v1/receipts/resolve": {"post": api.resolve_receipt()},
            "/healthz": {"get": _plain("Liveness and the agent served", "Health")},
            "/openapi.json": {"get": _document_op()},
            "/problems": {"get": _problems_op()},
            "/problems/{slug}": {"get": _problem_op()},
            "/console": {"get": _asset_op("The operator console", "text/html")},
            "/console/console.js": {"get": _asset_op("Console script", "text/javascript")},
            "/console/console.css": {"get": _asset_op("Console styles", "text/css")},
        },
        "components": {"schemas": schemas},
    }
    if auth:
        document["components"]["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": (
                    "token → principal: a name, a tenant and a role; a user posts turns "
                    "and reads its tenant's threads, an operator also lists and resolves "
                    "receipts"
                ),
            }
        }
    return document


def _component_schemas(max_message_chars: int) -> dict[str, Any]:
    inputs = [(name, mode, pydantic.TypeAdapter(cls)) for name, cls, mode in _MODELS]
    _, definitions = pydantic.TypeAdapter.json_schemas(inputs, ref_template=_REF)
    schemas: dict[str, Any] = definitions["$defs"]
    message = schemas["TurnBody"]["properties"]["message"]
    for branch in message["anyOf"]:
        if branch.get("type") == "string":
            branch["maxLength"] = max_message_chars
    return schemas


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _json(description: str, schema: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref(schema)}},
    }
    if headers:
        response["headers"] = headers
    return response


def _problems(statuses: Iterable[int], exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The problem responses of ``statuses``.

    Each has every problem type of its status, except those named in ``exclude``.
    """
    responses: dict[str, Any] = {}
    excluded = set(exclude)
    for status in sorted(set(statuses)):
        kinds = [t for t in PROBLEM_TYPES.values() if t.status == status and t.slug not in excluded]
        schema = {
            "allOf": [
                _ref("Problem"),
                {
                    "properties": {
                        "type": {"enum": [t.uri for t in kinds]},
                        "status": {"const": status},
                    }
                },
            ]
        }
        response: dict[str, Any] = {
            "description": "; ".join(f"{t.title}: {t.description}" for t in kinds),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": schema}},
        }
        if any(t.retry_after is not None for t in kinds):
            response["headers"] = {
                "Retry-After": {"description": "Seconds to wait", "schema": {"type": "string"}}
            }
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        if status == 405:
            response["headers"] = {"Allow": {"schema": {"type": "string"}}}
        responses[str(status)] = response
    return responses


def _streamable(response: dict[str, Any]) -> dict[str, Any]:
    """``response``, which may also be answered as server-sent events."""
    response["content"]["text/event-stream"] = {
        "schema": {
            "type": "string",
            "description": (
                'Server-sent events: `event: delta` (`{"text": ...}`), `step` (a '
                "StepResult and the `input` it ran with), `interaction` (an Interaction), "
                "`error` (problem details), "
                "and last `result` (the TurnResult)"
            ),
        }
    }
    return response


class _Api:
    """The four API operations; ``auth`` adds security and 401."""

    def __init__(self, auth: bool) -> None:
        self.auth = auth

    def _op(
        self,
        op: dict[str, Any],
        ok: dict[str, Any],
        statuses: Iterable[int],
        *,
        operator: bool = False,
        forbids: bool = False,
    ) -> dict[str, Any]:
        """An operation's 403 responses.

        With ``operator``, a token of another role is refused with 403 ``forbidden``.
        With ``forbids``, the operation answers ``forbidden`` for another reason.
        That holds with or without tokens.
        The guard's 403 ``cross-origin`` belongs to every operation.
        """
        problems = set(statuses) | set(GUARD_STATUSES) | ({401} if self.auth else set())
        role = () if forbids or (self.auth and operator) else ("forbidden",)
        op["responses"] = {"200": ok, **_problems(problems, role)}
        if self.auth:
            op["security"] = [{"bearer": []}]
        return op

    def post_turn(self) -> dict[str, Any]:
        replayed = {
            "Idempotency-Replayed": {
                "description": "true when the stored result of a committed turn was returned",
                "schema": {"type": "string", "enum": ["true", "false"]},
            }
        }
        op = self._op(
            {
                "operationId": "postTurn",
                "summary": "Run (or replay) one turn",
                "description": (
                    "The turn ID comes from the body's turn_id or the Idempotency-Key header "
                    "(both given and different: 400; neither: 422). A committed turn ID sent "
                    "again with the same request returns the stored result; with another "
                    "request, 409 turn-conflict. With `Accept: text/event-stream` the turn is "
                    "answered as server-sent events (`event: delta | step | interaction | "
                    "result`, `data:` JSON) as it runs; the last is `result`, the same "
                    "TurnResult; a replay streams only `result`. Events before `result` are "
                    "provisional; a failure after the stream started is an `error` event "
                    "with problem details. A client that disconnects does not abort the turn: "
                    "retry with the same turn ID for its committed result."
                ),
                "parameters": [
                    _path_id(),
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "description": "The turn ID, if the body has none",
                        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("TurnBody")}},
                },
            },
            _streamable(_json("The turn's result (also for a replay)", "TurnResult", replayed)),
            (400, 404, 409, 413, 415, 422, 500, 502, 503),
            forbids=True,  # an answer whose actor is not the caller's principal
        )
        op["responses"]["202"] = _json(
            "Queued in the thread's inbox (an agent with on_busy queue or interrupt, on a "
            "busy thread): the same turn ID sent again answers its position while it "
            "waits, and its result once it ran. With `Prefer: respond-async`: the turn is "
            "accepted and runs to its commit in the background (a TurnStatus with its "
            "`url` and `events`; `Location` and `Preference-Applied: respond-async`)",
            "Queued",
        )
        op["responses"]["202"]["content"]["application/json"]["schema"] = {
            "anyOf": [_ref("Queued"), _ref("TurnStatus")]
        }
        op["parameters"] += [
            {
                "name": "Prefer",
                "in": "header",
                "required": False,
                "description": "`respond-async` (RFC 7240): answer 202 at once, run detached",
                "schema": {"type": "string"},
            },
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "With `Accept: text/event-stream`: resume after this event",
                "schema": {"type": "string"},
            },
        ]
        return op

    def get_turn(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "getTurn",
                "summary": "A turn's status, and its result once committed",
                "description": (
                    "`queued`, `running` or `committed` (with `result`). A queued turn "
                    "whose accepting process died is drained by the process answering. "
                    "A timer's turn (`timer:<key>@<due time>`) is read here too, and an "
                    "expiry's (`expire:<interaction id>`)."
                ),
                "parameters": [
                    _path_id(),
                    {"name": "turn_id", "in": "path", "required": True, "schema": ID_SCHEMA},
                ],
            },
            _json("Where the turn is", "TurnStatus"),
            (404, 422, 500, 503),
        )

    def get_turn_events(self) -> dict[str, Any]:
        op = self._op(
            {
                "operationId": "getTurnEvents",
                "summary": "A turn's events as server-sent events, resumable",
                "description": (
                    "Each event has an `id:`. The stream resumes after the `Last-Event-ID` "
                    "header (or the `after` query parameter), from any process on the "
                    "store. Rounds are recorded as they end; `result` comes last. "
                    "A timer's turn (`timer:<key>@<due time>`) is watched here too, and an "
                    "expiry's (`expire:<interaction id>`)."
                ),
                "parameters": [
                    _path_id(),
                    {"name": "turn_id", "in": "path", "required": True, "schema": ID_SCHEMA},
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
            },
            {
                "description": "The turn's events",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            (404, 422, 500, 503),
        )
        op["responses"]["204"] = {"description": "Resumed after `result`: nothing is left"}
        return op

    def cancel_turn(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "cancelTurn",
                "summary": "Stop one turn of the thread (Kernel.cancel)",
                "description": (
                    "`status` says what the cancel found. `committed`: the turn had "
                    "committed, and nothing changed. `dequeued`: it waited in the thread's "
                    "inbox and was removed; it will not run. `requested`: the request is "
                    "recorded; a running turn stops at its next safe point, commits what it "
                    "did, and its reply says it was cancelled. A turn ID not yet delivered "
                    "stops at its first safe point. Allowed to whoever may post a turn to "
                    "the thread; another tenant's thread is 404."
                ),
                "parameters": [
                    _path_id(),
                    {"name": "turn_id", "in": "path", "required": True, "schema": ID_SCHEMA},
                    {
                        "name": "reason",
                        "in": "query",
                        "required": False,
                        "description": "Why, for the turn's reply and its turn.cancelled event",
                        "schema": {"type": "string", "maxLength": MAX_ANSWER_TEXT},
                    },
                ],
            },
            _json("What the cancel found and did", "Cancellation"),
            (404, 422, 500, 503),
        )

    def get_thread(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "getThread",
                "summary": "A thread's conversation, facts, interaction and agenda",
                "parameters": [_path_id()],
            },
            _json("The thread's latest checkpoint", "ThreadView"),
            (404, 409, 422, 500, 503),
        )

    def get_timers(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "getTimers",
                "summary": "A thread's timers: the turns the kernel will run later",
                "description": (
                    "In key order, at most `limit`, of one `status` if given. Read as the "
                    "thread is: another tenant's thread is 404, as is a thread with no turn "
                    "and no timer. Keys beginning with `kernel:` are the kernel's own "
                    "(a confirmation's expiry and reminder)."
                ),
                "parameters": [
                    _path_id(),
                    {
                        "name": "status",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["pending", "fired", "void"]},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                ],
            },
            _json("The thread's timers", "TimerList"),
            (404, 422, 500, 503),
        )

    def list_receipts(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "listReceipts",
                "summary": "Effect receipts (the current one per thread and key), oldest first",
                "parameters": [
                    {"name": "thread_id", "in": "query", "required": False, "schema": ID_SCHEMA},
                    {
                        "name": "status",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": [s.value for s in ReceiptStatus]},
                    },
                ],
            },
            _json("Receipts of the caller's threads", "ReceiptList"),
            (422, 500, 503),
            operator=True,
        )

    def list_interactions(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "listInteractions",
                "summary": "Pending interactions (confirmations) across the caller's threads "
                "(operators)",
                "description": (
                    "In thread ID order, at most `limit`; pass `next_after` as `after` to read on."
                ),
                "parameters": [
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                    {"name": "after", "in": "query", "required": False, "schema": ID_SCHEMA},
                ],
            },
            _json("Pending interactions of the caller's threads", "InteractionList"),
            (404, 422, 500, 503),
            operator=True,
        )

    def resolve_receipt(self) -> dict[str, Any]:
        return self._op(
            {
                "operationId": "resolveReceipt",
                "summary": "Reconcile an uncertain receipt (applied or not)",
                "description": (
                    "The caller (an operator token's principal, or `anonymous` without "
                    "tokens) is recorded as the resolution's actor, with the note. "
                    "`applied: true` needs `value`, what later uses of the receipt get "
                    "(`null` if the provider returned nothing); `applied: false` takes none."
                ),
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ResolveBody")}},
                },
            },
            _json("The resolved receipt", "Receipt"),
            (400, 404, 409, 413, 415, 422, 500, 503),
            operator=True,
        )


def _path_id() -> dict[str, Any]:
    return {"name": "thread_id", "in": "path", "required": True, "schema": ID_SCHEMA}


def _plain(summary: str, schema: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "security": [],
        "responses": {"200": _json(summary, schema), **_problems(GUARD_STATUSES)},
    }


def _document_op() -> dict[str, Any]:
    return {
        "summary": "This document",
        "security": [],
        "responses": {
            "200": {
                "description": "OpenAPI 3.1",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            **_problems(GUARD_STATUSES),
        },
    }


def _problems_op() -> dict[str, Any]:
    listing = {"type": "array", "items": _ref("ProblemType")}
    return {
        "summary": "Every problem type the host answers with",
        "security": [],
        "responses": {
            "200": {
                "description": "Problem types",
                "content": {"application/json": {"schema": listing}},
            },
            **_problems(GUARD_STATUSES),
        },
    }


def _problem_op() -> dict[str, Any]:
    return {
        "summary": "One problem type (the target of a problem's `type` URI)",
        "security": [],
        "parameters": [
            {
                "name": "slug",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "enum": sorted(PROBLEM_TYPES)},
            }
        ],
        "responses": {
            "200": {
                "description": "The problem type",
                "content": {"application/json": {"schema": _ref("ProblemType")}},
            },
            **_problems([404, *GUARD_STATUSES]),
        },
    }


def _asset_op(summary: str, media_type: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "security": [],
        "responses": {
            "200": {
                "description": summary,
                "content": {media_type: {"schema": {"type": "string"}}},
            },
            **_problems(GUARD_STATUSES),
        },
    }
