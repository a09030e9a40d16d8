"""The travel example: ``python -m examples.travel --db sqlite:///travel.db``."""
