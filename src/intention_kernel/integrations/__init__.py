"""Bridges that run agents written with other frameworks inside durable turns."""
