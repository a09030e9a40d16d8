"""Model-check the turn protocol (models/turn_protocol.pml) with SPIN, and the
protocols built on its turns: the thread inbox (models/inbox.pml) and the timers
(models/timers.pml).

``python3 models/check_protocol.py`` runs the exhaustive verification of each model
(assertions, then the LTL claim), then each mutant, and prints for every run the
states stored, the depth reached, the memory and the seconds. Names (or shell-style
patterns) as arguments run only those runs, ``--list`` lists them:
``python3 models/check_protocol.py 'inbox*'``. It exits non-zero if
the model has a counterexample (its trail printed with ``spin -t -p``) or a mutant
has none. pan is compiled into ``build/model-check/`` (git-ignored). Needs ``spin``
and ``cc`` (``apt-get install spin gcc``); without them it says so in one line and
exits 2. Standard library only, so that ``make model-check`` needs no venv.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
MODEL = MODELS / "turn_protocol.pml"
BUILD = ROOT / "build" / "model-check"

#: pan's memory bound (MB): a run that needs more stops as incomplete, and fails.
MEMORY_LIMIT_MB = 3000
#: pan's search depth bound; the model's deepest path is under 250 steps.
MAX_DEPTH = 200_000


@dataclass(frozen=True)
class Run:
    """One verification, with its ``defines`` for spin and cc.

    With ``ltl`` it checks the LTL claim instead of the assertions alone. That is a
    search for acceptance cycles under weak fairness. A mutant's ``expect`` is the
    property it must break; ``None`` means that none may break. The model is the
    file ``model`` in models/. The hash table of pan has 2 to the power
    ``hash_bits`` slots, of 8 bytes each (its ``-w`` option)."""

    name: str
    defines: tuple[str, ...] = ()
    ltl: bool = False
    expect: str | None = None
    model: str = MODEL.name
    hash_bits: int = 24


#: The protocol: its assertions (safety), then its LTL claim. The LTL run lets dead
#: sessions' locks be dropped late, by the reaper, and bounds the operator at one
#: resolution (the claim is about the lock, which more resolutions only hold longer).
#: The runs of over 20 million states get a table of 64 million slots. In pan's
#: default of 16 million, chains grow long as the table fills. The smaller runs
#: are faster with the default: a larger table costs more to clear and to touch.
MODEL_RUNS = (
    Run("protocol", hash_bits=26),
    Run("protocol-ltl", ("-DLOCK_RELEASE_DELAYED", "-DMAX_RESOLVE=1"), ltl=True, hash_bits=26),
    # PostgreSQL's thread leases: pauses past the expiry, takeovers, fenced writes.
    Run("leases", ("-DLEASES",), hash_bits=26),
    # The thread inbox: queue and cancel; interrupt; steer (models/inbox.pml).
    Run("inbox", model="inbox.pml"),
    Run("inbox-interrupt", ("-DINTERRUPT",), model="inbox.pml"),
    Run("inbox-steer", ("-DSTEER",), model="inbox.pml"),
    # A steer's taker whose client never comes back; the steer's client does.
    Run("inbox-steer-orphan", ("-DSTEER", "-DSTEER_ORPHAN"), model="inbox.pml"),
    # Timers: set with a turn, claimed with a lease, fired once (models/timers.pml).
    Run("timers", model="timers.pml"),
    # Timers queued in an inbox agent's thread, and cancelled (issue 37, round 3).
    # Two crashes keep it near 1.4 GB; three (checked once: 44 million states,
    # 2.7 GB, exhaustive) come close to the memory bound.
    Run(
        "timers-inbox",
        ("-DINBOX", "-DNR=2", "-DMAX_CRASH=2"),
        model="timers.pml",
        hash_bits=26,
    ),
)

#: Each mutant, and the property whose assertion (or claim) it must break.
MUTANT_RUNS = (
    Run("no-fence", ("-DNO_FENCE",), expect="(seen==total_commits)"),
    Run("retried-prepared", ("-DRETRY_PREPARED",), expect="(applied_since_na<=1)"),
    Run("no-lock", ("-DNO_LOCK",), expect="(applied_since_na<=1)"),
    Run("tenant-outside-lock", ("-DTENANT_OUTSIDE_LOCK",), expect="(rtenant==principal)"),
    Run("live-resolve", ("-DLIVE_RESOLVE",), expect="(applied_since_na<=1)"),
    Run("no-journal-read", ("-DNO_JOURNAL_READ",), expect="!(journal[t])|| !( !(lost[me]))"),
    Run("unfenced-prepare", ("-DLEASES", "-DUNFENCED_PREPARE"), expect="!(lost[me])"),
    Run("unfenced-journal", ("-DLEASES", "-DUNFENCED_JOURNAL"), expect="!(lost[me])"),
    Run("renew-no-epoch", ("-DLEASES", "-DRENEW_NO_EPOCH"), expect="!(lost[me])"),
    Run("expiry-short", ("-DLEASES", "-DEXPIRY_SHORT"), expect="(paused[me]|| !(lost[me]))"),
    Run(
        "lock-outlives-holder",
        ("-DLOCK_RELEASE_DELAYED", "-DLOCK_OUTLIVES_HOLDER", "-DMAX_RESOLVE=1"),
        ltl=True,
        expect="acceptance cycle",
    ),
    # The inbox's mutants.
    Run("inbox-remove-first", ("-DREMOVE_BEFORE_RUN",), expect="(lost==0)", model="inbox.pml"),
    Run("inbox-fresh-id", ("-DFRESH_TURN_ID",), expect="(runs[msg]<=1)", model="inbox.pml"),
    Run("inbox-jump-queue", ("-DNO_INBOX_CHECK",), expect="(late==0)", model="inbox.pml"),
    Run(
        "inbox-no-start-check",
        ("-DNO_START_CHECK",),
        expect="!(dequeued[cur])||nothing",
        model="inbox.pml",
    ),
    # The start mark: none, or written apart from the start's read of its stop.
    Run(
        "inbox-no-start-mark",
        ("-DNO_START_MARK",),
        expect="!(dequeued[cur])||nothing",
        model="inbox.pml",
    ),
    Run(
        "inbox-start-mark-apart",
        ("-DSTART_MARK_APART",),
        expect="!(dequeued[cur])||nothing",
        model="inbox.pml",
    ),
    # A cancel that dequeues the copy of a turn whose other delivery holds the lock.
    Run(
        "inbox-no-holder-check",
        ("-DNO_HOLDER_CHECK",),
        expect="!(dequeued[cur])||nothing",
        model="inbox.pml",
    ),
    Run(
        "interrupt-aborts",
        ("-DINTERRUPT", "-DSTOP_ABORTS"),
        expect="(unsettled==0)",
        model="inbox.pml",
    ),
    Run(
        "interrupt-base-only",
        ("-DINTERRUPT", "-DBASE_ONLY_INTERRUPT"),
        expect="other_interrupter",
        model="inbox.pml",
    ),
    # The interrupt of the code before its fix, a mutant (see models/inbox.pml).
    Run(
        "interrupt-by-base-at-start",
        ("-DINTERRUPT", "-DINTERRUPT_BY_BASE_AT_START"),
        expect="other_interrupter",
        model="inbox.pml",
    ),
    Run(
        "steer-release-recorded",
        ("-DSTEER", "-DRELEASE_RECORDED"),
        expect="(runs[i]<=1)",
        model="inbox.pml",
    ),
    Run(
        "steer-no-taker-drain",
        ("-DSTEER", "-DSTEER_ORPHAN", "-DNO_TAKER_DRAIN"),
        expect="answered",
        model="inbox.pml",
    ),
    Run(
        "steer-unjournaled",
        ("-DSTEER", "-DNO_STEER_JOURNAL"),
        expect="(seen_round[i]==r)",
        model="inbox.pml",
    ),
    Run(
        "steer-takes-committed",
        ("-DSTEER", "-DSTEER_TAKES_COMMITTED"),
        expect="(runs[i]<=1)",
        model="inbox.pml",
    ),
    Run(
        "steer-unchecked-at-begin",
        ("-DSTEER", "-DSTEER_UNCHECKED_AT_BEGIN"),
        expect="(runs[i]<=1)",
        model="inbox.pml",
    ),
    # The timers' mutants.
    Run(
        "timer-settled-apart",
        ("-DSETTLE_OUTSIDE",),
        expect="(lost==0)",
        model="timers.pml",
    ),
    Run("timer-fresh-id", ("-DFRESH_TURN_ID",), expect="(applied[mydue]<=1)", model="timers.pml"),
    Run("timer-claim-forever", ("-DNO_CLAIM_EXPIRY",), expect="(lost==0)", model="timers.pml"),
    Run("timer-row-unread", ("-DNO_ROW_CHECK",), expect="!(voided[mydue])", model="timers.pml"),
    Run("timer-set-early", ("-DSET_OUTSIDE_TURN",), expect="set_by[mydue]", model="timers.pml"),
    Run(
        "timer-cancel-unread",
        ("-DINBOX", "-DNR=2", "-DMAX_CRASH=2", "-DNO_CANCEL_CHECK"),
        expect="dequeued",
        model="timers.pml",
    ),
)


@dataclass(frozen=True)
class Result:
    run: Run
    states: int
    depth: int
    memory_mb: float
    seconds: float
    complete: bool
    violation: str | None  # pan's line naming the counterexample, if any
    report: str
    trail: str

    def summary(self) -> str:
        if self.violation:
            found = f"counterexample: {self.violation}"
        elif self.complete:
            found = "exhaustive, no counterexample"
        else:
            found = "INCOMPLETE search (memory or depth bound reached)"
        return (
            f"{self.run.name:26} {self.states:>11,} states  depth {self.depth:>4}  "
            f"{self.memory_mb:8.1f} MB  {self.seconds:6.1f} s  {found}"
        )


#: The Debian (and Ubuntu) package of each tool a run needs.
PACKAGES = {"spin": "spin", "cc": "gcc"}


def tools_missing() -> list[str]:
    """The tools a run needs that are not on the PATH."""
    return [tool for tool in ("spin", "cc") if shutil.which(tool) is None]


def install_command(missing: list[str]) -> str:
    """The Debian command that installs the ``missing`` tools."""
    return "apt-get install " + " ".join(PACKAGES[tool] for tool in missing)


def fault_labels(text: str | None = None) -> set[str]:
    """The model's crash labels: each label placed on a POINT or COMMIT_POINT."""
    source = MODEL.read_text() if text is None else text
    return set(re.findall(r"^\s*([a-z_]+):\s*(?:POINT|COMMIT_POINT)\b", source, re.MULTILINE))


def verify(run: Run, build: Path = BUILD) -> Result:
    """Generate, compile and run pan for ``run``; on a counterexample, its trail."""
    work = build / run.name
    work.mkdir(parents=True, exist_ok=True)
    model = work / run.model
    shutil.copyfile(MODELS / run.model, model)
    for stale in work.glob("*.trail"):
        stale.unlink()
    defines = list(run.defines)
    subprocess.run(["spin", *defines, "-a", model.name], cwd=work, check=True, capture_output=True)
    # A mutant's pan stops at its first counterexample: -O1 compiles in half the
    # time of -O2 and runs nearly as fast (all mutants: 83 s against 113, idle).
    optimize = "-O1" if run.expect else "-O2"
    flags = [optimize, f"-DMEMLIM={MEMORY_LIMIT_MB}", "-DCOLLAPSE", *defines]
    flags += ["-DNFAIR=3"] if run.ltl else ["-DSAFETY", "-DNOCLAIM"]
    subprocess.run(["cc", *flags, "-o", "pan", "pan.c"], cwd=work, check=True, capture_output=True)
    options = [f"-m{MAX_DEPTH}", f"-w{run.hash_bits}"] + (["-a", "-f"] if run.ltl else [])
    started = time.monotonic()
    done = subprocess.run(["./pan", *options], cwd=work, capture_output=True, text=True)
    seconds = time.monotonic() - started
    report = done.stdout + done.stderr
    violation = next(
        (
            line.strip()
            for line in report.splitlines()
            if line.startswith("pan:")
            and any(
                kind in line for kind in ("assertion violated", "acceptance cycle", "end state")
            )
        ),
        None,
    )
    trail = ""
    if list(work.glob("*.trail")):
        shown = subprocess.run(
            ["spin", *defines, "-t", "-p", "-g", model.name],
            cwd=work,
            capture_output=True,
            text=True,
        )
        trail = shown.stdout
    return Result(
        run=run,
        states=_number(r"([\d.e+]+) states, stored", report),
        depth=_number(r"depth reached (\d+)", report),
        memory_mb=float(_match(r"([\d.]+)\s+total actual memory usage", report) or 0),
        seconds=seconds,
        complete=violation is not None or "Search not completed" not in report,
        violation=violation,
        report=report,
        trail=trail,
    )


def _match(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text)
    return found.group(1) if found else None


def _number(pattern: str, text: str) -> int:
    found = _match(pattern, text)
    return int(float(found)) if found else 0


def selected(names: list[str]) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """The model runs and mutant runs named (or matched by a pattern) in ``names``;
    all of them without names. A name that matches nothing raises ValueError."""
    if not names:
        return MODEL_RUNS, MUTANT_RUNS
    every = MODEL_RUNS + MUTANT_RUNS
    for name in names:
        if not any(fnmatch.fnmatchcase(run.name, name) for run in every):
            raise ValueError(f"no run is named {name!r}: see --list")

    def chosen(runs: tuple[Run, ...]) -> tuple[Run, ...]:
        return tuple(r for r in runs if any(fnmatch.fnmatchcase(r.name, n) for n in names))

    return chosen(MODEL_RUNS), chosen(MUTANT_RUNS)


def main(argv: list[str] | None = None) -> int:
    names = sys.argv[1:] if argv is None else argv
    if "--list" in names:
        for run in MODEL_RUNS + MUTANT_RUNS:
            kind = f"mutant, breaks {run.expect}" if run.expect else "model"
            print(f"{run.name:26} {run.model:18} {' '.join(run.defines):40} {kind}")
        return 0
    try:
        model_runs, mutant_runs = selected(names)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    missing = tools_missing()
    if missing:
        # One line: a fresh machine has no SPIN.
        print(
            f"model-check needs {' and '.join(missing)} on the PATH: "
            f"install it with `{install_command(missing)}` (Debian, Ubuntu)",
            file=sys.stderr,
        )
        return 2
    failed = False
    for run in model_runs:
        result = verify(run)
        print(result.summary(), flush=True)
        if result.violation or not result.complete:
            failed = True
            print(result.report)
            print(result.trail or "(no trail)")
    for run in mutant_runs:
        result = verify(run)
        print(result.summary(), flush=True)
        if result.violation is None or run.expect not in result.violation:
            failed = True
            print(f"mutant {run.name} should break {run.expect}, got: {result.violation}")
            print(result.report)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("LC_ALL", "C")
    sys.exit(main())
