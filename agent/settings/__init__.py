"""The configuration: every key with its default and its check, loading and validation."""
