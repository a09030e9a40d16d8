"""A help desk written with Pydantic AI, run inside durable turns (see __main__)."""
