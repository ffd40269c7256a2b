"""From a run's config to a ready engine and its workload's requests.

The config comes in as Hydra resolves it, a plain mapping, and is read once into a typed
``BenchConfig`` (``run.config``: every value checked there, named as the config names it).
The engine is built from that: the backend, then what depends on it (``max_model_len=auto``,
a pool sized from its memory, checked against the machine's), the allocator, the scheduler.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from paged_bench.backends.base import Backend
from paged_bench.core.clock import make_clock
from paged_bench.core.engine import Engine
from paged_bench.core.kv.base import Allocator, AllocatorCounters, KVLayout
from paged_bench.core.request import Request
from paged_bench.errors import MAX_TOKENS, ConfigError, PluginError, check
from paged_bench.model.tokenizers import serving_tokenizer
from paged_bench.run.config import BenchConfig
from paged_bench.run.memory import check_kv_pool_fits
from paged_bench.run.plugin_options import PagedOptions
from paged_bench.sizing.kv_capacity import KVBudget
from paged_bench.workloads.base import Workload, WorkloadContext

AUTO_MODEL_LEN = 2048  # max_model_len=auto where the backend has no model to take it from


@dataclass
class Bench:
    """An engine ready to run, the requests it will serve, and the config that made them."""

    engine: Engine
    requests: list[Request]
    config: BenchConfig
    choices: dict[str, str]  # plugin kind -> plugin name
    kv_budget: KVBudget | None = None  # how num_blocks=auto sized the pool from the hardware
    max_concurrency: int | None = None  # the workload's closed loop: most requests in flight

    @property
    def backend(self) -> Backend:
        return self.engine.backend


def typed(config: BenchConfig | Mapping[str, Any]) -> BenchConfig:
    """``config`` read and checked (``BenchConfig.from_config``), unless it already is."""
    return config if isinstance(config, BenchConfig) else BenchConfig.from_config(config)


def _check_positions(config: BenchConfig, backend: Backend) -> None:
    """A model computes positions up to its ``max_position_embeddings``; past them its rotary
    angles are ones it never saw, and its output is another model's. vLLM refuses such a
    ``max_model_len`` too (its derived maximum is the same config field), so a roofline run is
    held to its model's too: its figures are those of a model vLLM would serve."""
    model, max_model_len = backend.model_config, config.scheduler.model_len
    if model is not None and max_model_len > model.max_position_embeddings:
        raise ConfigError("max_model_len", max_model_len,
                          f"at most {model.max_position_embeddings}, the model's max_position_embeddings "
                          f"(set max_model_len={model.max_position_embeddings} or less)")  # fmt: skip
    # past its window a Mistral attends to its last sliding_window tokens only, which this
    # engine does not do: up to it, full attention is the same model
    if model is not None and model.sliding_window is not None and max_model_len > model.sliding_window:
        raise ConfigError("max_model_len", max_model_len,
                          f"at most {model.sliding_window}, the model's sliding_window (sliding-window attention "
                          f"is not supported; set max_model_len={model.sliding_window} or less)")  # fmt: skip


def _check_allocator_state(allocator: Allocator, name: str) -> None:
    """What the engine and the summary read of every allocator (a plugin's own ``__init__`` that
    skipped the base class's stopped the run at its end, its results unwritten)."""
    for attr, cls in (("layout", KVLayout), ("counters", AllocatorCounters)):
        if not isinstance(getattr(allocator, attr, None), cls):
            raise PluginError(f"allocator {name!r} sets no self.{attr} (a {cls.__module__}.{cls.__name__}): "
                              "call the base class's __init__, or set it there")  # fmt: skip


def _check_layout_follows(config: BenchConfig, layout: KVLayout, num_blocks: int, name: str) -> None:
    """An allocator's pool is the one the config sizes (an option file without
    ``block_size: ${block_size}`` kept the plugin's own default, and the pool was another size)."""
    for key, want, got in (("block_size", config.cache.block_size, layout.block_size),
                           ("num_blocks", num_blocks, layout.num_blocks)):  # fmt: skip
        if want != got:
            raise PluginError(f"allocator {name!r} made a pool of {key}={got}, not the configured {want}: its option "
                              f"file needs {key}: ${{{key}}} (and the class must use it)")  # fmt: skip


def _check_one_sequence_fits(config: BenchConfig, num_blocks: int, budget: KVBudget | None) -> None:
    """The pool must hold one max_model_len sequence. One that ``num_blocks=auto`` sized from the
    hardware says what to change instead, as vLLM's ``check_enough_kv_cache_memory`` does (nobody
    set num_blocks)."""
    block_size, max_model_len = config.cache.block_size, config.scheduler.model_len
    longest = num_blocks * block_size
    if longest >= max_model_len:
        return
    if budget is None:
        raise ConfigError("num_blocks", config.cache.num_blocks,
                          f"a pool that holds one max_model_len={max_model_len} sequence "
                          f"(now {num_blocks} blocks x {block_size} = {longest} slots)")  # fmt: skip
    raise ConfigError("max_model_len", max_model_len,
                      f"at most {longest:,}: what the KV memory left on {budget.hardware} at "
                      f"backend.gpu_memory_utilization={budget.gpu_memory_utilization} holds; raise it, lower "
                      "max_model_len, or split the model over more GPUs (backend.tensor_parallel_size)")  # fmt: skip


def _check_within_budget(num_blocks: int, block_size: int, budget: KVBudget) -> None:
    """A pool set by hand holds no more than the hardware's memory does next to the model: a
    bigger one reported terabytes of KV on one GPU, where a real engine fails to allocate."""
    if num_blocks > (most := budget.blocks(block_size)):
        raise ConfigError("num_blocks", num_blocks,
                          f"at most {most:,}: what the KV memory left on {budget.hardware} at "
                          f"backend.gpu_memory_utilization={budget.gpu_memory_utilization} holds "
                          "(num_blocks=auto sizes the pool from it)")  # fmt: skip


def _pool_size(config: BenchConfig, budget: KVBudget | None) -> int:
    """The pool's blocks: as set, or for ``num_blocks=auto`` what the backend's memory holds next
    to its model (``budget``, when it knows both), else enough blocks for ``max_batch``
    sequences of ``max_model_len``: no memory pressure."""
    block_size = config.cache.block_size
    if isinstance(config.cache.num_blocks, int):
        return config.cache.num_blocks
    if budget is not None:
        return budget.blocks(block_size)
    return config.scheduler.max_batch * -(-config.scheduler.model_len // block_size)


def build_engine(config: BenchConfig | Mapping[str, Any], copies: int = 1) -> tuple[Engine, KVBudget | None]:
    """An engine (backend, allocator, scheduler, clock) from a run's config, and how
    ``num_blocks=auto`` sized its pool (None when it did not). ``copies``: how many such
    engines the run builds (a cluster's replicas), for the memory check."""
    config = typed(config)
    backend = config.plugins["backend"].build()
    try:
        return _engine_on(backend, with_model_len(config, backend), copies)
    except BaseException:  # a refused setting must not leave the backend's model or workers behind
        backend.close()
        raise


def with_model_len(config: BenchConfig, backend: Backend) -> BenchConfig:
    """``config`` with ``max_model_len=auto`` made the model's context, as vLLM derives it when
    none is given: its ``max_position_embeddings``, or its sliding window if shorter, as vLLM
    with ``--disable-sliding-window`` (this engine has no sliding-window attention: past the
    window it would not attend as the model does); ``AUTO_MODEL_LEN``, vLLM's fallback, for a
    backend with no model (the linear simulator)."""
    if config.scheduler.max_model_len != "auto":
        return config
    model = backend.model_config
    value = AUTO_MODEL_LEN if model is None else min(model.max_position_embeddings, model.sliding_window or MAX_TOKENS)
    return config.with_model_len(value)


def _engine_on(backend: Backend, config: BenchConfig, copies: int) -> tuple[Engine, KVBudget | None]:
    """``build_engine`` once its backend is made: the allocator, the scheduler and the clock."""
    _check_positions(config, backend)
    budget = backend.kv_budget(config.scheduler.max_num_batched_tokens, config.scheduler.max_batch)
    num_blocks = _pool_size(config, budget)
    if not config.cache.auto_sized:
        if budget is not None:
            _check_within_budget(num_blocks, config.cache.block_size, budget)
        budget = None  # the pool was not sized from it
    allocator_choice = config.plugins["allocator"].with_options(num_blocks=num_blocks)
    checked = allocator_choice.checked
    swap_blocks = checked.swap_blocks if isinstance(checked, PagedOptions) else None
    check_kv_pool_fits(config.cache, config.scheduler.max_batch, num_blocks, swap_blocks, backend, copies)
    _check_one_sequence_fits(config, num_blocks, budget)
    allocator = allocator_choice.build()
    _check_allocator_state(allocator, allocator_choice.name)
    # the pool it made is the one the checks above were about
    _check_layout_follows(config, allocator.layout, num_blocks, allocator_choice.name)
    backend.bind(allocator)

    scheduler = config.plugins["scheduler"].build(allocator, max_model_len=config.scheduler.model_len,
                                                  eos_token_id=backend.eos_token_id,
                                                  stop_token_ids=backend.stop_token_ids)  # fmt: skip
    clock = backend.clock if config.run.clock == "auto" else config.run.clock
    _check_step_timer(backend, clock)
    return Engine(scheduler, backend, make_clock(clock), step_timer=backend.step_timer), budget


def _check_step_timer(backend: Backend, clock: str) -> None:
    """``backend.step_timer=thread_cpu`` times a step on virtual time by the engine thread's CPU
    time: on the wall clock there is no step to time apart from the clock, and a backend that
    computes on more threads than the engine's would have their work go uncounted."""
    if backend.step_timer == "wall":
        return
    check(clock == "virtual", "backend.step_timer", backend.step_timer,
          f"wall on the wall clock (clock={clock}); thread_cpu times steps on virtual time: add clock=virtual")
    check(backend.threads == 1, "backend.step_timer", backend.step_timer,
          f"wall with backend.threads={backend.threads}; thread_cpu counts the engine thread's CPU time alone, "
          "so the backend must compute on it alone: backend.threads=1")
    device = getattr(backend, "device", None)
    check(device is None or getattr(device, "type", "cpu") == "cpu", "backend.step_timer", backend.step_timer,
          f"wall on {device}: thread_cpu times CPU work, and a GPU's kernels run beside it")


def build_workload(config: BenchConfig | Mapping[str, Any]) -> Workload:
    return typed(config).plugins["workload"].build()


def workload_requests(workload: Workload, backend: Backend, tokenizer: str = "auto",
                      target: str = "engine") -> list[Request]:  # fmt: skip
    """The workload's requests, tokenized for ``backend``: a list of ``Request`` with ids of their
    own (a plugin's otherwise failed deep in a run, or ran as another workload). A text is read
    as our server reads it for this backend (``tokenizer``: ``server.tokenizer``'s choice), so a
    text trace's prompts are as long in-process as served; loaded only for a workload with text.
    ``target``: where they go (``WorkloadContext.target``)."""
    speaks = functools.cache(lambda: serving_tokenizer(tokenizer, backend.tokenizer, backend.vocab_size))
    reqs = workload.requests(WorkloadContext(backend.vocab_size, lambda text: speaks().encode(text), target))
    # checked by type, not per request: a big trace's 20,000 requests cost a Python call each
    if not (isinstance(reqs, list) and all(issubclass(t, Request) for t in set(map(type, reqs)))):
        raise PluginError(f"workload {workload.name!r}: requests() returned {type(reqs).__name__}"
                          f"{' of ' + type(reqs[0]).__name__ if isinstance(reqs, list) and reqs else ''}, "
                          "not a list of paged_bench.core.request.Request")  # fmt: skip
    if len(set(map(attrgetter("request_id"), reqs))) != len(reqs):
        raise PluginError(f"workload {workload.name!r}: requests() returned requests sharing a request_id; "
                          "each needs its own")  # fmt: skip
    return reqs


def _note_capped(requests: list[Request], max_model_len: int) -> None:
    """Say so when requests ask for more tokens than a sequence may hold: the engine ends them
    at max_model_len (as vLLM's engine does), so the run serves shorter outputs than asked."""
    longest = max(map(operator.add, map(attrgetter("num_prompt_tokens"), requests),
                      map(attrgetter("max_tokens"), requests)), default=0)  # fmt: skip
    if longest <= max_model_len:  # the common case, in C
        return
    capped = sum(r.num_prompt_tokens < max_model_len < r.num_prompt_tokens + r.max_tokens for r in requests)
    if capped:
        print(f"note: {capped} of {len(requests)} requests ask for more tokens than max_model_len={max_model_len} "
              "holds (prompt + max_tokens): their outputs end there (finish_reason length), as vLLM's engine ends "
              "them; raise max_model_len to serve them whole", file=sys.stderr)  # fmt: skip


def build(cfg: BenchConfig | Mapping[str, Any]) -> Bench:
    """A run's engine and requests from its config (read and checked first: nothing is built
    for a config that has a bad value)."""
    config = typed(cfg)
    workload = build_workload(config)  # its settings are checked before a model loads
    engine, budget = build_engine(config)
    try:
        tokenizer = (config.source.get("server") or {}).get("tokenizer", "auto")
        requests = workload_requests(workload, engine.backend, tokenizer, config.run.target)
    except BaseException:
        engine.backend.close()
        raise
    _note_capped(requests, engine.scheduler.max_model_len)
    return Bench(engine, requests, config, config.choices, kv_budget=budget, max_concurrency=workload.max_concurrency)
