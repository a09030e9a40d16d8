"""Interpreters for language models, each behind its own extra.

- :mod:`intention_kernel.interpreters.openai`: ``OpenAIInterpreter``, for OpenAI-compatible APIs.
  Its extra installs with ``pip install 'intention-kernel[openai]'``.

Nothing is imported here, so this package loads without any SDK installed.
Import the interpreter from its module.
Rules and scripts need no extra: ``RuleInterpreter`` lives in ``intention_kernel``.
``ScriptedInterpreter`` lives in ``intention_kernel.testing``, with the other testing tools.
"""

from __future__ import annotations

__all__: list[str] = []
