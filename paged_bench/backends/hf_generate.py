"""``backend=hf_generate``: the baseline, Hugging Face's ``generate`` serving one request at a
time, as a notebook server does.

The same weights as ``numpy``/``torch`` (random from the seed, or ``model_path``) are loaded
into ``transformers``' ``LlamaForCausalLM``. When a request's prompt is scheduled,
``generate`` starts in a thread with a streamer (the documented way to stream from it) and
each engine step waits for its next token, so the engine stamps every token when
``generate`` produced it. K/V live in Hugging Face's own cache: the allocator's blocks are
only booked, which is exactly the memory picture of such a server.

Run it with ``max_batch=1`` (any scheduler then serves one request at a time). The option
``backend.max_batch`` (always 1) says so to configs: an experiment comparing backends sets
``max_batch: ${oc.select:backend.max_batch,8}``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

import torch

from paged_bench.backends.base import Backend
from paged_bench.core.plan import NewRequestData, ReqId, StepOutput, StepPlan
from paged_bench.errors import EngineError, check, check_int
from paged_bench.model.config import resolve_model
from paged_bench.model.hf import to_transformers
from paged_bench.model.ops_torch import pick_device, pick_dtype
from paged_bench.model.runner import adopt_model
from paged_bench.model.weights import make_state
from paged_bench.run.threads import job_threads, pin_torch_threads

_END = object()


class _Streamer:
    """generate's streamer protocol: ``put`` gets the prompt first, then each new token."""

    def __init__(self, out: queue.Queue) -> None:
        self.out, self.prompt_seen = out, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.out.put(int(token))

    def end(self) -> None:
        self.out.put(_END)


class HFGenerateBackend(Backend):
    name = "hf_generate"
    clock = "wall"

    def __init__(
        self,
        *,
        model: str | Mapping[str, Any] = "small",
        model_path: str | None = None,
        seed: int = 0,
        device: str = "auto",
        dtype: str = "auto",
        max_batch: int = 1,
        threads: int | None = None,
    ) -> None:
        super().__init__()
        check_int("backend.seed", seed, 0)
        self.threads = threads = job_threads("backend.threads", threads)
        check(max_batch == 1, "backend.max_batch", max_batch, "1: a generate loop has room for one request")
        dev = pick_device(device)
        dt = pick_dtype(dtype, dev)
        cfg = resolve_model(model, model_path)
        adopt_model(self, cfg, model_path, dt)
        self._end_ids = [t for t in (self.eos_token_id, *self.stop_token_ids) if t is not None] or None
        self.model = to_transformers(cfg, make_state(cfg, model_path, seed), str(dev), dt)
        self.device = dev
        self._saved_threads = pin_torch_threads(threads)  # restored by close()
        self._seed = seed
        self._known: dict[ReqId, NewRequestData] = {}  # requests the plans introduced, not yet gone
        self._current: ReqId | None = None
        self._tokens: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()

    def _generate(self, req: NewRequestData) -> None:
        from transformers import StoppingCriteria, StoppingCriteriaList

        cancel = self._cancel

        class _Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

        sp = req.sampling
        sampled = sp.temperature > 0
        if sampled:
            torch.manual_seed(self._seed if sp.seed is None else sp.seed)
        try:
            with torch.inference_mode():
                self.model.generate(
                    torch.tensor([req.token_ids], device=self.device),
                    attention_mask=torch.ones((1, len(req.token_ids)), dtype=torch.long, device=self.device),
                    max_new_tokens=sp.max_tokens,
                    do_sample=sampled,
                    temperature=sp.temperature if sampled else None,
                    top_p=sp.top_p if sampled else None,
                    top_k=None,
                    # ignore_eos: no EOS at all (min_new_tokens would ban it instead, changing tokens)
                    eos_token_id=None if sp.ignore_eos else self._end_ids,
                    pad_token_id=self.eos_token_id if self.eos_token_id is not None else 0,
                    streamer=_Streamer(self._tokens),
                    stopping_criteria=StoppingCriteriaList([_Cancelled()]),
                )
        except Exception as e:  # noqa: BLE001 - handed to the engine's thread, which raises it
            self._tokens.put(e)

    def _start(self, req: NewRequestData) -> None:
        self._stop()
        if len(req.token_ids) > req.num_prompt_tokens:
            raise EngineError(
                f"backend 'hf_generate' cannot resume request {req.req_id} after a preemption: "
                "use scheduler=static max_batch=1 and a pool that holds a sequence"
            )
        self._current = req.req_id
        self._tokens = queue.Queue()
        self._thread = threading.Thread(target=self._generate, args=(req,), daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        if self._thread is not None:
            self._cancel.set()
            self._thread.join()
            self._cancel.clear()
        self._thread = self._current = None

    def execute(self, plan: StepPlan) -> StepOutput:
        for rid in (*plan.finished_req_ids, *plan.preempted_req_ids):
            self._known.pop(rid, None)
        self._known.update((new.req_id, new) for new in plan.new_reqs)
        if not plan.req_ids:  # a multi-step window running out after its request ended: nothing to generate
            return StepOutput([])
        if plan.num_reqs != 1:
            raise EngineError(
                f"backend 'hf_generate' serves one request at a time (a plain generate loop) but the step "
                f"holds {plan.num_reqs}: use scheduler=static max_batch=1"
            )
        (row,) = plan.rows()
        if not row.samples:
            return StepOutput([0])  # a prefill chunk short of the prompt's end: generate waits for all of it
        if row.req_id != self._current:
            self._start(self._known[row.req_id])
        token = self._tokens.get()
        if isinstance(token, Exception):
            raise EngineError(f"transformers generate failed: {type(token).__name__}: {token}") from token
        if token is _END:
            raise EngineError(f"generate ended request {row.req_id} before the engine did")
        return StepOutput([token])

    def close(self) -> None:
        self._stop()
        torch.set_num_threads(self._saved_threads)
