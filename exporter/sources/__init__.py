"""Adapters that touch the host: each wraps one library and hands the core value objects."""
