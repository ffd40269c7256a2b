"""From a resolved config to a ready engine and its workload's requests.

The config is a plain mapping (Hydra's, resolved): top-level knobs plus one section per
plugin kind, each with a ``name`` (the plugin) and that plugin's options. Top-level knobs
are checked here so that a bad value names its key before anything is built.
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
from paged_bench.core.kv.base import AllocatorCounters, KVLayout
from paged_bench.core.request import Request
from paged_bench.errors import MAX_TOKENS, ConfigError, PluginError, check, check_int, check_number
from paged_bench.model.tokenizers import serving_tokenizer
from paged_bench.results.metrics import SLO_KEYS
from paged_bench.run import registry
from paged_bench.run.compose import check_settings
from paged_bench.run.memory import check_kv_pool_fits
from paged_bench.sizing.kv_capacity import KVBudget
from paged_bench.workloads.base import Workload, WorkloadContext

PLUGIN_KINDS = ("workload", "scheduler", "allocator", "backend")
# plugin options copied from the top level (``allocator.block_size: ${block_size}``)
MIRRORED_KNOBS = ("num_blocks", "block_size", "max_model_len")  # allocator options copied from the top level
# scheduler options copied from the top level, which sizes the pool, the backend's activations and
# its per-step cap: an option file may set a lower value (a narrower policy), never a higher one
CAPPED_KNOBS = ("max_batch", "max_num_batched_tokens")
AUTO_MODEL_LEN = 2048  # max_model_len=auto where the backend has no model to take it from


@dataclass
class Bench:
    """An engine ready to run, the requests it will serve, and the config that made them."""

    engine: Engine
    requests: list[Request]
    config: dict[str, Any]
    choices: dict[str, str]  # plugin kind -> option name
    kv_budget: KVBudget | None = None  # how num_blocks=auto sized the pool from the hardware
    max_concurrency: int | None = None  # the workload's closed loop: most requests in flight

    @property
    def backend(self) -> Backend:
        return self.engine.backend


def plugin_section(cfg: Mapping[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    section = cfg.get(kind)
    if isinstance(section, Mapping) and not isinstance(section.get("name"), str):
        # an option file (a plugin's, most likely) that forgot its name: key
        raise ConfigError(f"{kind}.name", section.get("name"), f"the name of an installed {kind} plugin: every {kind} "
                          f"option file sets name: to its plugin's entry-point name (see --plugins)")  # fmt: skip
    if not isinstance(section, Mapping):
        raise ConfigError(kind, section, f"a {kind} config group option, e.g. {kind}=<name> (see --help)")
    options = dict(section)
    return options.pop("name"), options


def check_top_level(cfg: Mapping[str, Any]) -> None:
    check_settings(cfg)
    check_int("block_size", cfg.get("block_size"), 1, MAX_TOKENS)
    check_int("max_batch", cfg.get("max_batch"))
    if cfg.get("max_model_len") != "auto":
        try:
            check_int("max_model_len", cfg.get("max_model_len"), 2)
        except ConfigError as e:
            raise ConfigError(e.key, e.value, f"{e.allowed}, or auto (the model's context)") from None
    check_int("max_num_batched_tokens", cfg.get("max_num_batched_tokens"))
    check_int("seed", cfg.get("seed"), 0)
    if cfg.get("num_blocks") not in (None, "auto"):
        check_int("num_blocks", cfg.get("num_blocks"))
    check(cfg.get("clock", "auto") in ("auto", "virtual", "wall"), "clock", cfg.get("clock"), "auto, virtual or wall")
    _check_engine_target(cfg.get("target"))
    slo = cfg.get("slo") or {}
    check(isinstance(slo, Mapping), "slo", slo, f"a mapping with keys {', '.join(SLO_KEYS)}")
    for key, value in slo.items():
        check(key in SLO_KEYS, f"slo.{key}", value, f"one of {', '.join(SLO_KEYS)}")
        if value is not None:
            check_number(f"slo.{key}", value, 0, strict=True, finite=False)


def _check_engine_target(target: Any) -> None:
    """The in-process engine takes no target options: ``+target.base_url=...`` beside it ran the
    engine and measured no server, without a word."""
    if isinstance(target, Mapping) and target.get("name") == "engine":
        for key, value in target.items():
            check(key == "name", f"target.{key}", value,
                  "no option with target=engine (the in-process engine); target=openai sends to a server")


def _check_mirrors_top_level(cfg: Mapping[str, Any]) -> None:
    """An allocator's copy of a top-level knob (``allocator.block_size: ${block_size}``) must be
    that knob, and a scheduler's may not exceed it: the pool's size, the backend's limits and
    the memory check read the top level (``scheduler.max_batch=64`` alone ran out of KV blocks
    in a pool sized for 16, and passed a backend that serves one request at a time)."""
    _, allocator = plugin_section(cfg, "allocator")
    for key in MIRRORED_KNOBS:
        if key in allocator and allocator[key] != cfg.get(key):
            value = "null" if cfg.get(key) is None else cfg.get(key)
            raise ConfigError(f"allocator.{key}", allocator[key],
                              f"{key}'s value, {value} (set the top-level {key}: the pool's size and the backend "
                              "follow it)")  # fmt: skip
    _, scheduler = plugin_section(cfg, "scheduler")
    for key in CAPPED_KNOBS:
        if key in scheduler and not (isinstance(scheduler[key], int) and scheduler[key] <= cfg[key]):
            raise ConfigError(f"scheduler.{key}", scheduler[key],
                              f"at most {key}'s value, {cfg[key]} (set the top-level {key}: the pool, the backend "
                              "and the memory check follow it)")  # fmt: skip


def _check_positions(cfg: Mapping[str, Any], backend: Backend) -> None:
    """A model computes positions up to its ``max_position_embeddings``; past them its rotary
    angles are ones it never saw, and its output is another model's. vLLM refuses such a
    ``max_model_len`` too (its derived maximum is the same config field), so a roofline run is
    held to its model's too: its figures are those of a model vLLM would serve."""
    model = backend.model_config
    if model is not None and cfg["max_model_len"] > model.max_position_embeddings:
        raise ConfigError("max_model_len", cfg["max_model_len"],
                          f"at most {model.max_position_embeddings}, the model's max_position_embeddings "
                          f"(set max_model_len={model.max_position_embeddings} or less)")  # fmt: skip
    # past its window a Mistral attends to its last sliding_window tokens only, which this
    # engine does not do: up to it, full attention is the same model
    if model is not None and model.sliding_window is not None and cfg["max_model_len"] > model.sliding_window:
        raise ConfigError("max_model_len", cfg["max_model_len"],
                          f"at most {model.sliding_window}, the model's sliding_window (sliding-window attention "
                          f"is not supported; set max_model_len={model.sliding_window} or less)")  # fmt: skip


def _check_allocator_state(allocator: Any, name: str) -> None:
    """What the engine and the summary read of every allocator (a plugin's own ``__init__`` that
    skipped the base class's stopped the run at its end, its results unwritten)."""
    for attr, cls in (("layout", KVLayout), ("counters", AllocatorCounters)):
        if not isinstance(getattr(allocator, attr, None), cls):
            raise PluginError(f"allocator {name!r} sets no self.{attr} (a {cls.__module__}.{cls.__name__}): "
                              "call the base class's __init__, or set it there")  # fmt: skip


def _check_layout_follows(cfg: Mapping[str, Any], layout: KVLayout, num_blocks: int, name: str) -> None:
    """An allocator's pool is the one the config sizes (an option file without
    ``block_size: ${block_size}`` kept the plugin's own default, and the pool was another size)."""
    for key, want, got in (("block_size", cfg["block_size"], layout.block_size), ("num_blocks", num_blocks,
                                                                                    layout.num_blocks)):
        if want != got:
            raise PluginError(f"allocator {name!r} made a pool of {key}={got}, not the configured {want}: its option "
                              f"file needs {key}: ${{{key}}} (and the class must use it)")  # fmt: skip


def _check_one_sequence_fits(cfg: Mapping[str, Any], num_blocks: int, budget: KVBudget | None) -> None:
    """The pool must hold one max_model_len sequence. One that ``num_blocks=auto`` sized from the
    hardware says what to change instead, as vLLM's ``check_enough_kv_cache_memory`` does (nobody
    set num_blocks)."""
    longest = num_blocks * cfg["block_size"]
    if longest >= cfg["max_model_len"]:
        return
    if budget is None:
        raise ConfigError("num_blocks", cfg.get("num_blocks"),
                          f"a pool that holds one max_model_len={cfg['max_model_len']} sequence "
                          f"(now {num_blocks} blocks x {cfg['block_size']} = {longest} slots)")  # fmt: skip
    raise ConfigError("max_model_len", cfg["max_model_len"],
                      f"at most {longest:,}: what the KV memory left on {budget.hardware} at "
                      f"backend.gpu_memory_utilization={budget.gpu_memory_utilization} holds; raise it, lower "
                      "max_model_len, or split the model over more GPUs (backend.tensor_parallel_size)")  # fmt: skip


def _check_within_budget(cfg: Mapping[str, Any], budget: KVBudget | None) -> None:
    """A pool set by hand holds no more than the hardware's memory does next to the model: a
    bigger one reported terabytes of KV on one GPU, where a real engine fails to allocate."""
    if budget is not None and cfg["num_blocks"] > (most := budget.blocks(cfg["block_size"])):
        raise ConfigError("num_blocks", cfg["num_blocks"],
                          f"at most {most:,}: what the KV memory left on {budget.hardware} at "
                          f"backend.gpu_memory_utilization={budget.gpu_memory_utilization} holds "
                          "(num_blocks=auto sizes the pool from it)")  # fmt: skip


def auto_num_blocks(cfg: Mapping[str, Any], budget: KVBudget | None) -> int:
    """What the backend's memory holds next to its model (``budget``, when it knows both), else
    enough blocks for ``max_batch`` sequences of ``max_model_len``: no memory pressure."""
    if budget is not None:
        return budget.blocks(cfg["block_size"])
    return cfg["max_batch"] * -(-cfg["max_model_len"] // cfg["block_size"])


def build_engine(cfg: Mapping[str, Any], copies: int = 1) -> tuple[Engine, KVBudget | None]:
    """An engine (backend, allocator, scheduler, clock) from a config whose top level is checked,
    and how ``num_blocks=auto`` sized its pool (None when it did not). ``copies``: how many
    such engines the run builds (a cluster's replicas), for the memory check."""
    _check_mirrors_top_level(cfg)  # before a model loads
    name, options = plugin_section(cfg, "backend")
    # a backend that serves a fixed number of requests at once says so in its options: refused
    # before its model loads, rather than at the first step that holds more
    cap = options.get("max_batch")
    if isinstance(cap, int) and cfg["max_batch"] > cap:
        raise ConfigError("max_batch", cfg["max_batch"], f"at most {cap} with backend={name} (backend.max_batch: it "
                                                         f"serves {cap} request(s) at a time)")  # fmt: skip
    backend = registry.create("backend", name, **options)
    try:
        return _engine_on(backend, with_model_len(cfg, backend), copies)
    except BaseException:  # a refused setting must not leave the backend's model or workers behind
        backend.close()
        raise


def with_model_len(cfg: Mapping[str, Any], backend: Backend) -> dict[str, Any]:
    """``cfg`` with ``max_model_len=auto`` made the model's context, as vLLM derives it when
    none is given: its ``max_position_embeddings``, or its sliding window if shorter, as vLLM
    with ``--disable-sliding-window`` (this engine has no sliding-window attention: past the
    window it would not attend as the model does); ``AUTO_MODEL_LEN``, vLLM's fallback, for a
    backend with no model (the linear simulator)."""
    if cfg.get("max_model_len") != "auto":
        return dict(cfg)
    model = backend.model_config
    value = AUTO_MODEL_LEN if model is None else min(model.max_position_embeddings, model.sliding_window or MAX_TOKENS)
    out = {**cfg, "max_model_len": value}
    if isinstance(cfg.get("allocator"), Mapping) and "max_model_len" in cfg["allocator"]:
        out["allocator"] = {**cfg["allocator"], "max_model_len": value}  # its mirror of the top level
    return out


def _engine_on(backend: Backend, cfg: Mapping[str, Any], copies: int) -> tuple[Engine, KVBudget | None]:
    """``build_engine`` once its backend is made: the allocator, the scheduler and the clock."""
    _check_positions(cfg, backend)
    name, options = plugin_section(cfg, "allocator")
    budget = backend.kv_budget(cfg["max_num_batched_tokens"], cfg["max_batch"])
    if options.get("num_blocks") in (None, "auto"):
        options["num_blocks"] = auto_num_blocks(cfg, budget)
    else:
        _check_within_budget(cfg, budget)
        budget = None  # the pool was not sized from it
    check_kv_pool_fits(cfg, options, backend, copies)
    _check_one_sequence_fits(cfg, options["num_blocks"], budget)
    allocator = registry.create("allocator", name, **options)
    _check_allocator_state(allocator, name)
    _check_layout_follows(cfg, allocator.layout, options["num_blocks"], name)  # so the checks above hold for it
    backend.bind(allocator)

    name, options = plugin_section(cfg, "scheduler")
    scheduler = registry.create(
        "scheduler",
        name,
        allocator,
        max_model_len=cfg["max_model_len"],
        eos_token_id=backend.eos_token_id,
        stop_token_ids=backend.stop_token_ids,
        internal=("max_model_len", "eos_token_id", "stop_token_ids"),
        **options,
    )

    clock_kind = cfg.get("clock", "auto")
    return Engine(scheduler, backend, make_clock(backend.clock if clock_kind == "auto" else clock_kind)), budget


def build_workload(cfg: Mapping[str, Any]) -> Workload:
    name, options = plugin_section(cfg, "workload")
    return registry.create("workload", name, **options)


def workload_requests(workload: Workload, backend: Backend, tokenizer: str = "auto") -> list[Request]:
    """The workload's requests, tokenized for ``backend``: a list of ``Request`` with ids of their
    own (a plugin's otherwise failed deep in a run, or ran as another workload). A text is read
    as our server reads it for this backend (``tokenizer``: ``server.tokenizer``'s choice), so a
    text trace's prompts are as long in-process as served; loaded only for a workload with text."""
    speaks = functools.cache(lambda: serving_tokenizer(tokenizer, backend.tokenizer, backend.vocab_size))
    reqs = workload.requests(WorkloadContext(backend.vocab_size, lambda text: speaks().encode(text)))
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


def build(cfg: Mapping[str, Any]) -> Bench:
    check_top_level(cfg)
    choices = {kind: plugin_section(cfg, kind)[0] for kind in PLUGIN_KINDS}
    workload = build_workload(cfg)  # its settings are checked before a model loads
    engine, budget = build_engine(cfg)
    try:
        requests = workload_requests(workload, engine.backend, (cfg.get("server") or {}).get("tokenizer", "auto"))
    except BaseException:
        engine.backend.close()
        raise
    _note_capped(requests, engine.scheduler.max_model_len)
    return Bench(engine, requests, dict(cfg), choices, kv_budget=budget, max_concurrency=workload.max_concurrency)
