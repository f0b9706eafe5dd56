"""Sparse attention fields plugged in as `MultiHeadAttention(pattern=...)` (survey §5.1)."""
