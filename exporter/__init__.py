"""llmstartup: follow LLM model-server units through startup and tell a hang from silent work."""

__version__ = "0.1.0"
