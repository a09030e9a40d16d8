"""The stored checkpoint layout's codec: a checkpoint's pieces as JSON, and back.

The pieces are the *core* (the thread row's document) and the JSON of each message,
fact and receipt index entry. :func:`assemble_checkpoint` puts stored pieces back
together into one checkpoint document. :func:`decode` and :func:`read_checkpoint` then
decode it. :mod:`intention_kernel.durability._layout` decides which pieces a commit
writes; this module says how each piece is spelled. Both are pure: an adapter only moves the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from intention_kernel._adapters import LazyAdapter, first_use_serializer
from intention_kernel._checkpoint import (
    _ADAPTER,
    KernelCheckpoint,
    Message,
    Migration,
    ReceiptRef,
    current_revision,
    decode_checkpoint,
)
from intention_kernel._facts import FactRecord
from intention_kernel.durability._contract.records import StoredThread
from intention_kernel.errors import CorruptRecordError

__all__ = [
    "assemble_checkpoint",
    "decode",
    "encode_bare_core",
    "encode_checkpoint_core",
    "encode_core",
    "encode_fact",
    "encode_message",
    "encode_receipt_ref",
    "read_checkpoint",
    "stamp",
]


# -- encoding the pieces -----------------------------------------------------------------

# Built at their first use (see ``_adapters``): at import they cost a third of it.
_MESSAGE = LazyAdapter(Message)
_FACT = LazyAdapter(FactRecord)
_RECEIPT_REF = LazyAdapter(ReceiptRef)
_ROWS = frozenset(("messages", "facts"))
_ROWS_AND_RECEIPTS = _ROWS | {"receipts"}
# The serializers of the pieces every commit writes, called directly: ``dump_json`` is
# a layer of Python that passes each of its options' defaults on every call, and the
# serializer's own defaults are the same, so the bytes are too. Each name is rebound
# to the real serializer at its first call.
_to_json = first_use_serializer(globals(), "_to_json", _ADAPTER)
_message_json = first_use_serializer(globals(), "_message_json", _MESSAGE)
_fact_json = first_use_serializer(globals(), "_fact_json", _FACT)
_receipt_ref_json = first_use_serializer(globals(), "_receipt_ref_json", _RECEIPT_REF)


def encode_checkpoint_core(checkpoint: KernelCheckpoint) -> str:
    """The checkpoint without its messages and facts, as compact JSON text."""
    return _ADAPTER().dump_json(checkpoint, exclude=_ROWS).decode()  # type: ignore[arg-type]


def encode_core(checkpoint: KernelCheckpoint, receipts: Sequence[str]) -> str:
    """The text :func:`encode_checkpoint_core` returns, from the index entries' JSON.

    ``receipts`` is each receipt index entry's JSON (:func:`encode_receipt_ref`), oldest first.
    The receipt index is most of a core, and a turn changes one or two entries.
    So a writer keeps each entry's JSON from the previous core, not encoding it again.
    The index is the core's last field, so it is put after the rest of the core.
    """
    head = _to_json(checkpoint, exclude=_ROWS_AND_RECEIPTS).decode()
    return f'{head[:-1]},"receipts":[{",".join(receipts)}]}}'


def encode_bare_core(checkpoint: KernelCheckpoint) -> str:
    """The core without its receipt index, for a store that keeps each index entry in a
    row of its own (``RecorderOptions.receipt_index_rows``)."""
    return _to_json(checkpoint, exclude=_ROWS_AND_RECEIPTS).decode()


def encode_receipt_ref(ref: ReceiptRef) -> str:
    """One receipt index entry as compact JSON, as it appears in a core."""
    return _receipt_ref_json(ref).decode()


def encode_message(message: Message) -> str:
    """One message as compact JSON, as its row holds it."""
    return _message_json(message).decode()


def encode_fact(record: FactRecord) -> str:
    """One fact record as compact JSON, as its row holds it."""
    return _fact_json(record).decode()


# -- reading the pieces ------------------------------------------------------------------


def assemble_checkpoint(
    core: str,
    messages: Sequence[str],
    facts: Sequence[tuple[str, str]],
    receipt_index: Sequence[str] | None = None,
) -> tuple[str, bool]:
    """The whole checkpoint document from a stored core and its rows.

    ``messages`` are the message rows, oldest first.
    ``facts`` are the fact rows as ``(key, record JSON)``, in recording order.
    ``receipt_index`` holds the index rows, oldest first (``None``: the core holds it).

    Returns the document, and whether it was stored in pieces as a commit would store it.
    A core that holds its own messages or facts is a whole document.
    An earlier version of the library wrote it.
    It is returned as it is, rows ignored, and the second value is ``False``.
    A core may hold its receipt index although index rows were read.
    It was then written before its store kept them.
    Its own index is used, and the second value is ``False`` too.
    Anything that is not a JSON object is returned unchanged.
    ``decode_checkpoint`` then refuses it.
    """
    try:
        document = json.loads(core)
    except ValueError:
        return core, False
    if not isinstance(document, dict) or not document or _ROWS & document.keys():
        return core, False
    facts_text = ",".join(f"{json.dumps(key, ensure_ascii=False)}:{body}" for key, body in facts)
    head = core.rstrip()[:-1]
    rows = f'"messages":[{",".join(messages)}],"facts":{{{facts_text}}}}}'
    if receipt_index is None or "receipts" in document:
        return f"{head},{rows}", receipt_index is None
    return f'{head},"receipts":[{",".join(receipt_index)}],{rows}', True


def decode(thread_id: str, thread: StoredThread) -> tuple[KernelCheckpoint, bool]:
    """The stored checkpoint, and whether its rows are exactly what a commit would store.

    They are if stored in rows, not as one document, and of the current schema revision.
    A migrated checkpoint's rows are of an older shape, so its next commit rewrites them."""
    assert thread.checkpoint is not None
    core = thread.checkpoint
    text, stored_in_rows = assemble_checkpoint(
        core, thread.messages, thread.facts, thread.receipt_index
    )
    # The core is encoded with ``schema_revision`` first; anything else is just not
    # trusted as exact, which costs one full rewrite and is always safe.
    exact = stored_in_rows and core.startswith(f'{{"schema_revision":{current_revision()},')
    return decode_checkpoint(text, thread_id=thread_id), exact


def read_checkpoint(
    thread_id: str, thread: StoredThread, migrations: Sequence[Migration] | None
) -> KernelCheckpoint:
    """The stored checkpoint, decoded by ``migrations`` (the registered ones if ``None``).

    It is refused as corrupt unless it is of the version its thread row names."""
    assert thread.checkpoint is not None
    text, _ = assemble_checkpoint(
        thread.checkpoint, thread.messages, thread.facts, thread.receipt_index
    )
    checkpoint = decode_checkpoint(text, thread_id=thread_id, migrations=migrations)
    if checkpoint.version != thread.version:
        raise CorruptRecordError(
            f"thread {thread_id!r} is at version {thread.version} but its checkpoint says "
            f"{checkpoint.version}",
            thread_id=thread_id,
        )
    return checkpoint


def stamp(thread: StoredThread) -> tuple[int | None, str | None]:
    """The schema revision and agent fingerprint the stored core names, if readable."""
    try:
        document = json.loads(thread.checkpoint or "")
    except ValueError:
        return None, None
    if not isinstance(document, dict):
        return None, None
    revision, fingerprint = document.get("schema_revision"), document.get("agent_fingerprint")
    return (
        revision if isinstance(revision, int) and not isinstance(revision, bool) else None,
        fingerprint if isinstance(fingerprint, str) else None,
    )
