"""A help desk written with the OpenAI Agents SDK, run inside durable turns (see __main__)."""
