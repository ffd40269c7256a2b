"""The backend protocol: executes a frozen step plan and returns the sampled tokens.

A real backend (``numpy``, ``torch``) computes a transformer step whose attention reads
K/V through the allocator's block tables, on the wall clock. A cost-model backend
(``sim``) computes no tokens and returns the step's modelled duration, on virtual time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Literal

from paged_bench.core.kv.base import Allocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.model.config import ModelConfig
from paged_bench.model.tokenizers import ByteTokenizer
from paged_bench.sizing.kv_capacity import KVBudget


class Backend(ABC):
    name: ClassVar[str] = ""
    clock: ClassVar[Literal["virtual", "wall"]] = "wall"

    vocab_size: int = ByteTokenizer.vocab_size
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # more ids that end a sequence (a checkpoint's other EOS ids)
    kv_bytes_per_token: int | None = None  # for the byte figures, when the model is known
    reads_token_ids: ClassVar[bool] = True  # False: plans carry no token ids (a cost model needs none)
    computes_kv: ClassVar[bool] = True  # writes real K/V into its pool (a cost model writes none)
    num_devices: int = 1  # GPUs (tensor-parallel ranks) a step runs on: throughput per GPU
    threads: int | None = None  # CPU threads each rank computes with (None: the library's own default)
    model_config: ModelConfig | None = None  # the model a backend computes (None: a cost model)
    # how the engine times a step of a wall-clock backend on virtual time (core.clock.STEP_TIMERS)
    step_timer: str = "wall"

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer()
        self.allocator: Allocator | None = None

    def bind(self, allocator: Allocator) -> None:
        """Called once before the first step: a real backend allocates its KV pool here, shaped
        by ``allocator.layout``. Block tables come with the plans, never from the allocator."""
        self.allocator = allocator

    def kv_budget(self, max_num_batched_tokens: int, max_num_seqs: int) -> KVBudget | None:
        """The KV space next to the model on the backend's hardware (``num_blocks=auto``), or
        None when it does not know its model and memory (the pool then holds max_batch
        full-length sequences)."""
        return None

    @abstractmethod
    def execute(self, plan: StepPlan) -> StepOutput:
        """Do the plan's swap copies, then compute its rows; one sampled token per row. Read the
        plan alone (``paged_bench.core.plan``; ``backends.request_state`` keeps what a real backend
        needs between steps): no live ``Request`` reaches a backend."""

    def close(self) -> None:
        """Release whatever the backend holds (device memory, threads)."""
