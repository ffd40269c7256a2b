"""Data files that ship with paged_bench: production request traces (``traces/``, see its README)."""
