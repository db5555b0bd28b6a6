"""Scripted model-server units in a private journald: the demo and the tests' real sources."""
