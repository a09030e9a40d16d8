"""Interpreters for language models, each behind its own extra.

- :mod:`intention_kernel.interpreters.openai`: ``OpenAIInterpreter``, for any
  OpenAI-compatible chat API (``pip install 'intention-kernel[openai]'``).

Nothing is imported here, so that this package loads without any SDK installed;
import the interpreter from its module. Rules and scripts need no extra:
``RuleInterpreter`` (``intention_kernel``) and ``ScriptedInterpreter``
(``intention_kernel.testing``).
"""

from __future__ import annotations

__all__: list[str] = []
