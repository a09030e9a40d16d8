"""The billing example: ``python -m examples.billing --db sqlite:///billing.db``."""
