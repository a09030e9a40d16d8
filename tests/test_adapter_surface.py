"""The adapter-author surface (``intention_kernel.durability.abc``) beside the
application facade (``intention_kernel``)."""

from __future__ import annotations

import intention_kernel
import intention_kernel.durability as durability
import intention_kernel.durability.abc as abc
import intention_kernel.durability.contract as contract
import intention_kernel.durability.engine as engine
import intention_kernel.durability.ownership as ownership
import intention_kernel.durability.records as records
from intention_kernel import _ids


def test_the_adapter_surface_exports_the_storage_contract_as_defined() -> None:
    homes = (records, contract, engine, ownership, _ids, durability)
    for name in abc.__all__:
        defined = next(getattr(m, name) for m in homes if hasattr(m, name))
        assert getattr(abc, name) is defined, name
    for name in (
        "Recorder",
        "RecordedDurability",
        "RecorderOptions",
        "TurnRecord",
        "StoredThread",
        "TurnStart",
        "ThreadOwner",
        "Durability",
        "check_id",
    ):
        assert name in abc.__all__, name


def test_the_application_facade_holds_no_adapter_author_classes() -> None:
    assert "Recorder" not in intention_kernel.__all__
    assert "RecordedDurability" not in intention_kernel.__all__
    assert not hasattr(intention_kernel, "Recorder")
    assert "Kernel" in intention_kernel.__all__ and "TurnScope" in intention_kernel.__all__


def test_the_id_rules_have_one_home() -> None:
    assert abc.check_id is _ids.check_id
    assert (abc.MAX_ID_LENGTH, abc.MAX_ID_BYTES) == (_ids.MAX_ID_LENGTH, _ids.MAX_ID_BYTES)
