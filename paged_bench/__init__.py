"""paged_bench: a pluggable benchmarking framework for LLM serving engines.

PagedAttention-style KV allocation, continuous batching, preemption and prefix caching,
measured on timed workloads against simulated, real-model and remote engines.
"""

__version__ = "0.1.0"

from paged_bench.native.guard import guard  # before any compiled module is imported

guard()
