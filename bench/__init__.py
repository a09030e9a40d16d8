"""Benchmarks: durable turns against the database floor and against LangGraph and DBOS.

Run ``make bench`` (or ``.venv/bin/python -m bench [--quick]``); see ``bench/README.md``.
Every row runs in a worker process of its own (``bench.worker``), driven one at a
time by the coordinator (``bench.run``), which interleaves the rows in blocks and
compares them only within one run: absolute times on a shared machine are noise.
"""
