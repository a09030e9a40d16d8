"""The engine: the contract applied once over any recorder, one turn at a time."""
