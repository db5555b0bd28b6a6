"""Benchmarks of llmstartup against references measured in the same run: `python -m bench` (bench/README.md)."""
