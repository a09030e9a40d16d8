"""Runnable examples, one command each, from the repository root.

- ``python -m examples.billing``: charges that wait for the person's confirmation;
- ``python -m examples.travel``: bookings that confirm on their own, with a
  small-operation policy.

Both take ``--db sqlite:///file.db`` or ``--db postgresql://...``, ``--thread`` and
``--llm`` (see :mod:`examples._conversation`).
"""
