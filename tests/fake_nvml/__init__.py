"""A fake libnvidia-ml.so.1 for tests without a GPU: see README.md here."""
