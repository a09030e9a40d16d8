"""``python -m intention_kernel``: the same as the ``intention-kernel`` command."""

from __future__ import annotations

from intention_kernel.cli import main

if __name__ == "__main__":
    main()
