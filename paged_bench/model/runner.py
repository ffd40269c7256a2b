"""What the numpy and torch backends share: a model whose K/V live in the allocator's blocks.

``bind`` allocates the KV pool shaped by the allocator's layout (``num_blocks x block_size``
slots per layer, slabs for ``contiguous``) and the swap space; ``execute`` does the plan's
swap copies (out, then in: a block freed by a swap-out may be refilled in the same step),
then one batched forward over every scheduled request, and samples one token per request.
Subclasses only say which ``Ops`` (numpy or torch, and on what device) run the forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paged_bench.backends.base import Backend
from paged_bench.backends.request_state import RequestState, RequestStates
from paged_bench.core.kv.base import Allocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.errors import EngineError, check, check_int
from paged_bench.model.batch import StepBatch, build_batch, warmup_batch
from paged_bench.model.config import ModelConfig, resolve_model
from paged_bench.model.forward import forward
from paged_bench.model.logprobs import LogprobSinks, PromptRows
from paged_bench.model.sampling import is_greedy, sample_batch
from paged_bench.model.tokenizers import load_tokenizer
from paged_bench.model.weights import Weights, fuse, make_state


def adopt_model(backend: Backend, cfg: ModelConfig, model_path: str | None, kv_dtype: str) -> None:
    """Set what the engine, the workloads and the server read off a backend serving ``cfg``:
    its tokenizer (the checkpoint's, else the byte tokenizer), vocabulary, end ids and KV bytes."""
    backend.model_config = cfg
    backend.tokenizer = load_tokenizer(model_path)
    # a tokenizer with ids past the model's vocabulary stopped the run at its first such token
    check(backend.tokenizer.vocab_size <= cfg.vocab_size, "backend.model_path", model_path,
          f"a tokenizer whose {backend.tokenizer.vocab_size} ids fit the model's vocabulary of {cfg.vocab_size}")  # fmt: skip
    backend.vocab_size = cfg.vocab_size
    backend.eos_token_id = cfg.eos_token_id
    backend.stop_token_ids = cfg.more_eos_token_ids
    backend.kv_bytes_per_token = cfg.kv_bytes_per_token(kv_dtype)


class ModelBackend(Backend):
    clock = "wall"
    compute_dtype = "float32"  # what the K/V pool holds (a torch backend on CUDA picks its own)

    def __init__(
        self,
        *,
        model: str | Mapping[str, Any] = "small",
        model_path: str | None = None,
        seed: int = 0,
        step_timer: str = "wall",
    ) -> None:
        super().__init__()
        self.step_timer = step_timer  # checked with the clock it needs as the engine is built (run.bench)
        check_int("backend.seed", seed, 0)
        cfg = resolve_model(model, model_path)
        adopt_model(self, cfg, model_path, self.compute_dtype)
        self.ops = self.make_ops(cfg)
        self.weights = self.make_weights(cfg, model_path, seed)
        self._rng = np.random.default_rng(seed)
        self.pool: Any = None
        self.swap: Any = None
        self.states = RequestStates()
        self.sampling_failures: list | None = None  # the server's: isolate a request's sampling error
        self.logprob_sinks = LogprobSinks()  # the server's: requests that want log-probabilities
        self._prompt_rows: PromptRows | None = None

    def make_ops(self, cfg: ModelConfig) -> Any:
        raise NotImplementedError

    def make_weights(self, cfg: ModelConfig, model_path: str | None, seed: int) -> Weights:
        return fuse(make_state(cfg, model_path, seed), cfg, self.ops.asarray, self.ops.asmatrix)

    def bind(self, allocator: Allocator) -> None:
        super().bind(allocator)
        layout = allocator.layout
        self.pool = self.ops.new_pool(layout.num_slots)
        self.swap = self.ops.new_pool(layout.num_cpu_blocks * layout.block_size, host=True)
        self.ops.argmax(
            forward(self.ops, self.weights, self.model_config, self.pool, warmup_batch(min(16, layout.num_slots)))
        )

    def swap_copies(self, plan: StepPlan) -> None:
        swap_copies(self.ops, self.pool, self.swap, plan, self.allocator.layout.block_size)

    def batch(self, plan: StepPlan, states: list[RequestState]) -> StepBatch:
        """The plan's tokens packed, their K/V slots looked up (token ids checked), then the
        prompt positions whose log-probabilities a request asked for, if any."""
        batch = build_batch(plan, states, self.allocator.layout.block_size)
        self._prompt_rows = self.logprob_sinks.extend_batch(batch, plan, states)
        if batch.input_ids.min() < 0 or batch.input_ids.max() >= self.vocab_size:
            bad = next(
                rid for rid, s in zip(plan.req_ids, states) if not all(0 <= t < self.vocab_size for t in s.token_ids)
            )
            raise EngineError(
                f"request {bad} has token ids outside the model's vocabulary (0 to {self.vocab_size - 1})"
            )
        return batch

    def logits(self, plan: StepPlan, states: list[RequestState]) -> Any:
        """The forward over the plan's tokens: ops-native logits ``[plan.num_reqs, vocab]`` (then
        the prompt rows ``batch`` added)."""
        return forward(self.ops, self.weights, self.model_config, self.pool, self.batch(plan, states))

    def execute(self, plan: StepPlan) -> StepOutput:
        states = self.states.apply(plan)
        self.swap_copies(plan)
        if not states:
            return StepOutput([], 0.0)
        tokens = self.sample(plan, states, self.logits(plan, states))
        self.states.record_samples(plan, states, tokens)
        return StepOutput(tokens, 0.0)

    def sample(self, plan: StepPlan, states: list[RequestState], logits: Any) -> list[int]:
        """One token per row: argmax when every row is greedy and no prompt log-probabilities are
        wanted, else per-request sampling (a failure ends only that request, see
        ``sampling_failures``), recording the log-probabilities asked for."""
        prompt_rows = self._prompt_rows
        if prompt_rows is None and all(is_greedy(s.sampling) for s in states):
            return self.ops.argmax(logits)
        rows = self.ops.to_numpy(logits)
        samplings, lengths = [s.sampling for s in states], [len(s.token_ids) for s in states]
        tokens = sample_batch(rows, plan.req_ids, samplings, lengths, self._rng, self.sampling_failures)
        if prompt_rows is not None:
            self.logprob_sinks.record(plan, rows, tokens, prompt_rows)
        return tokens

    def close(self) -> None:
        self.pool = self.swap = None
        self.states.clear()


def block_slots(blocks: tuple[int, ...] | list[int], block_size: int) -> np.ndarray:
    """Every slot of ``blocks``, in order."""
    return (np.asarray(blocks, np.int64)[:, None] * block_size + np.arange(block_size)).ravel()


def swap_copies(ops: Any, pool: Any, swap: Any, plan: StepPlan, block_size: int) -> None:
    """The plan's swap copies: out to host memory first, then in (a block freed by a swap-out
    may be refilled in the same step)."""
    if plan.swap_out:
        gpu, cpu = zip(*plan.swap_out)
        ops.copy_slots(pool, swap, block_slots(gpu, block_size), block_slots(cpu, block_size))
    if plan.swap_in:
        cpu, gpu = zip(*plan.swap_in)
        ops.copy_slots(swap, pool, block_slots(cpu, block_size), block_slots(gpu, block_size))
