"""Shortest-job-first scheduling for paged_bench (an example plugin package)."""
