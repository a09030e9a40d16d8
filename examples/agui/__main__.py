"""Serve the billing agent over AG-UI: ``python -m examples.agui [--db URL] [--port N]``."""

from __future__ import annotations

import argparse

import uvicorn

from examples.agui import page_app
from examples.billing.agent import FakePayments, build_agent
from intention_kernel import Kernel
from intention_kernel.durability import open_durability


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default="sqlite:///agui.db", help="the store's URL")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    kernel = Kernel(build_agent(FakePayments()), open_durability(options.db))
    print(f"open http://127.0.0.1:{options.port}/ in a browser")
    uvicorn.run(page_app(kernel), host="127.0.0.1", port=options.port, log_level="warning")


if __name__ == "__main__":
    main()
