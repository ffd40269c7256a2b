"""When a step's outputs reach the client (``frontend.output_timing``): at the step's end
(``step``, the default), or as vLLM 0.6.0's OpenAI server hands them over with its asynchronous
output processing on (``vllm060``, its default for CUDA with CUDA graphs; also 0.6.1).

What vLLM 0.6.0 does (tag v0.6.0, commit 32e7db25365415841ebc7c4215851743fbb1bad1):

- A step's sampled tokens are not processed when the step ends: ``_AsyncLLMEngine.step_async``
  queues them (``ctx.output_queue``, ``is_async=True``) and the *next* step processes them from
  its model runner, once that step's forward pass is launched (``model_runner.py``
  ``execute_model``: ``model_input.async_callback()`` before sampling; ``llm_engine.py``
  ``_process_model_outputs``), so a prompt step's first tokens, and a request's last token, are
  turned into outputs during the following step.
- Multi-step (``--num-scheduler-steps``): a window's tokens become outputs once, with its last
  step's (``_process_model_outputs``: "For multi-step, do not create outputs each iteration"),
  again during the next step; a request that ends inside the window gets its output when that
  step's sampler output is pythonized, which, the CPU running ahead of the GPU, is at the
  window's end (``multi_step_model_runner.py`` ``_final_process_outputs``, blocking on each step).
- Those outputs are put into each request's ``asyncio.Queue`` (``AsyncStream.put``) from the
  thread the step runs in (``make_async`` -> ``run_in_executor``; the callback runs inside
  ``execute_model``), a foreign thread for the engine process's event loop (uvloop,
  ``rpc/server.py``): that wakes nothing, so the RPC server's ``generate`` coroutine sends them to
  the API server only when the loop next wakes: when the step's call returns (a prompt step, a
  single step and a window's last step block until their GPU work is done; a window's other
  steps return once launched) or when a new request reaches the engine (a ZMQ message). When the
  engine has nothing left to run the queue is drained at once (``step_async``).

So, with ``vllm060``: the outputs of a prompt step, a single step or a window's last step (with
the window's earlier tokens) reach the client when the next step returns: the next step's end,
or its start where it opens a multi-step window (the CPU time before its launch, a few ms, is
not added); a request that ended inside a window, at the window's end, with its tokens of that
window (its output carries every token not sent yet); each of them earlier if a
request reaches the engine in between, and at the step's own end when no step follows at once.
vLLM 0.6.2 replaced this path (MQLLMEngine, vllm-project/vllm#8157). The engine's own timeline
(step records, when blocks are freed) is unchanged: only the times the client sees move.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from paged_bench.core.engine import EngineResult
from paged_bench.errors import EngineError

OUTPUT_TIMINGS = ("step", "vllm060")


def deliver_as_vllm060(result: EngineResult, window_log: list[int]) -> None:
    """Re-time every token (and the end of a request that ended with one) of ``result`` to when
    vLLM 0.6.0's server hands it to the client (the module's docstring); ``window_log``: each
    step's place in a multi-step window, as the scheduler logged it (-1 outside one). The
    requests' arrival times must be those the engine saw (before the front end puts the send
    times back)."""
    ends = result.steps.column("time")
    starts = ends - result.steps.column("duration")
    if len(window_log) != len(ends):
        raise EngineError(f"frontend.output_timing=vllm060: {len(window_log)} steps logged for {len(ends)} recorded "
                          "(a run that keeps every step record is needed)")  # fmt: skip
    arrivals = sorted(r.arrival_time for r in result.requests)
    batch, alone = _delivery_times(starts, ends, np.asarray(window_log), arrivals)
    step_of = {float(t): i for i, t in enumerate(ends)}
    for req in result.requests:
        times = req.token_times
        if not times:
            continue
        ended_with_token = req.finish_time == times[-1]
        # its last output carries every token not sent yet: its window's earlier ones too
        final = float(alone[step_of[times[-1]]]) if ended_with_token else float("inf")
        for k, t in enumerate(times):
            times[k] = min(float(batch[step_of[t]]), final)
        if ended_with_token:
            times[-1] = req.finish_time = final
    finished = [r.finish_time for r in result.requests if r.finish_time is not None]
    result.duration = max([result.duration, *finished])


def _delivery_times(
    starts: np.ndarray, ends: np.ndarray, window: np.ndarray, arrivals: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: when a token it produced reaches the client (``batch``), and when the last
    token of a request that ended in it does (``alone``: differs inside a window)."""
    n = len(ends)
    in_window = window >= 0
    following = np.append(window[1:], -1)
    closes = ~in_window | (following <= 0)  # its outputs wait for the next step (a window's last step too)
    returns = np.where(closes, ends, starts)  # when the step's call returns to the event loop

    def woken(put: float, at: float) -> float:  # a request reaching the engine in between wakes the loop
        j = bisect_right(arrivals, put)
        return min(at, arrivals[j]) if j < len(arrivals) else at

    closing = np.empty(n)
    for i in range(n):
        if i + 1 < n and starts[i + 1] <= ends[i]:  # the next step runs at once: its callback, its return
            closing[i] = woken(starts[i + 1], returns[i + 1])
        else:  # nothing runs next: the engine drains its queue at once
            closing[i] = ends[i]
    batch, alone = closing.copy(), closing.copy()
    last = n - 1
    for i in range(n - 1, -1, -1):  # inside a window: with its last step's outputs
        if closes[i]:
            last = i
        else:
            batch[i] = closing[last]
            alone[i] = woken(ends[i], ends[last])
    return batch, alone
