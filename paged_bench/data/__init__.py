"""Data files that ship with paged_bench: production request traces (``traces/``) and request
lengths of public datasets (``lengths/``: ShareGPT, as vLLM's benchmark samples it); each folder's README gives its source and licence."""
