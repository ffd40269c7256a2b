"""vLLM 0.6.0's own engine in front of paged_bench's GPU, for benchmarks/vllm060_engine_burst.py.

Run with the interpreter of benchmarks/vllm060/make_env.sh's virtualenv, as stand_in.py's ``serve``:

    ENV/bin/python benchmarks/vllm060/real_engine.py --model DIR --port P [vLLM's server flags]

vllm/entrypoints/openai/api_server.py runs as its ``__main__`` does, its RPC server and its
AsyncLLMEngine (scheduler, block manager, multi-step windows, asynchronous output processing,
detokeniser) as they are; only the executor is replaced. The stand-in executor's GPU is a sleep in
the thread vLLM runs the model in (``make_async``), as long as paged_bench's measured cost model
prices that step's GPU work (``MeasuredCost.gpu_seconds``: ``PB_HARDWARE``, ``PB_MODEL``,
``PB_TP``; the engine's CPU is vLLM's own, so none is priced), and every sequence samples one
token. A multi-step window's outputs go back as vLLM 0.6.0's MultiStepModelRunner hands them
back (vllm/worker/multi_step_model_runner.py: with asynchronous output processing each earlier
step's output is queued once the next step is launched, the last returned; without it all at the
window's end). Each step's start, end, prompt tokens and sequences are written to ``PB_STEP_LOG``
(JSON) when the engine process gets SIGUSR1. With ``STAND_IN_ENGINE_PYTHON`` (stand_in.py's) the API
server runs on this interpreter (make_env.sh's with PYTHON: CPython 3.10, torch a stub) and the
engine process on that one.
"""

import asyncio
import json
import os
import signal
import sys
import time

STEP_LOG = os.environ.get("PB_STEP_LOG", "steps.json")


def gpu_pricer():
    """A step's GPU seconds from paged_bench's measured cost model, for vLLM's ExecuteModelRequest."""
    from paged_bench.backends.sim import SimBackend
    from paged_bench.core.plan import StepPlan

    cost = SimBackend(cost_model="measured", hardware=os.environ.get("PB_HARDWARE", "h100"),
                      model=os.environ.get("PB_MODEL", "llama-3-8b"),
                      tensor_parallel_size=int(os.environ.get("PB_TP", "1"))).measured

    def seconds(groups, block_size: int) -> float:
        computed, new = [], []
        for g in groups:
            data = next(iter(g.seq_data.values()))
            done = data.get_num_computed_tokens()
            computed.append(done)
            new.append(data.get_len() - done if g.is_prompt else 1)
        # a multi-step window's groups stay in vLLM's batch to its last step, ended or not: each a row
        plan = StepPlan(req_ids=tuple(g.request_id for g in groups), num_computed_tokens=tuple(computed),
                        num_new_tokens=tuple(new), num_decode_tokens=sum(not g.is_prompt for g in groups))
        return cost.gpu_seconds(plan, block_size)

    return seconds


def stand_in_executor(block_size: int):
    from vllm.executor.executor_base import ExecutorAsyncBase
    from vllm.model_executor.layers.sampler import SamplerOutput
    from vllm.sequence import CompletionSequenceGroupOutput, Logprob, SequenceOutput

    price = gpu_pricer()
    steps: list[dict[str, float]] = []

    class StandInExecutor(ExecutorAsyncBase):
        uses_ray = False

        def __init__(self, *args, **kwargs) -> None:
            self.held: list = []  # a window's earlier outputs, as the multi-step worker holds them
            super().__init__(*args, **kwargs)

        def _init_executor(self) -> None:
            pass

        def determine_num_available_blocks(self):
            return 30_000, 2_048  # GPU blocks of 16 tokens: the pool never limits these bursts

        def initialize_cache(self, num_gpu_blocks, num_cpu_blocks) -> None:
            pass

        def check_health(self) -> None:
            pass

        def execute_model(self, req):
            start = time.perf_counter()
            groups = req.seq_group_metadata_list
            gpu = price(groups, block_size)
            window = bool(groups) and groups[0].state.num_steps > 1
            callback = req.async_callback
            if callback is not None:  # the model runner calls it once the forward is launched
                callback()
                if window and self.held:
                    ctx = callback.keywords["ctx"]
                    for out in self.held:  # (outputs, metadata, scheduler outputs, is_async, is_last_step)
                        queued = ([out], ctx.seq_group_metadata_list, ctx.scheduler_outputs, False, False)
                        ctx.output_queue.append(queued)
                        callback()
                    self.held = []
            time.sleep(max(0.0, gpu - (time.perf_counter() - start)))
            sample = [[SequenceOutput(next(iter(g.seq_data)), 1000, {1000: Logprob(0.0)})] for g in groups]
            out = SamplerOutput(outputs=[CompletionSequenceGroupOutput(samples=one, prompt_logprobs=None)
                                         for one in sample])  # fmt: skip
            prompt_tokens = sum(next(iter(g.seq_data.values())).get_len() for g in groups if g.is_prompt)
            end = time.perf_counter()
            steps.append({"start": start, "end": end, "prompt_tokens": prompt_tokens, "seqs": len(groups)})
            if not window:
                return [out]
            if callback is None:  # no asynchronous output processing: the window's outputs at its end
                self.held.append(out)
                if req.is_last_step:
                    whole, self.held = self.held, []
                    return whole
                return [out]
            if not req.is_last_step:
                self.held.append(out)
            return [out]

        async def execute_model_async(self, req):
            return await asyncio.get_running_loop().run_in_executor(None, self.execute_model, req)

        async def stop_remote_worker_execution_loop_async(self) -> None:
            pass

        def stop_remote_worker_execution_loop(self) -> None:
            pass

        def shutdown(self) -> None:
            pass

        # no LoRA, no prompt adapters: ExecutorBase's abstract methods, answered "none"
        add_lora = remove_lora = pin_lora = add_prompt_adapter = remove_prompt_adapter = pin_prompt_adapter = (
            lambda self, _: False)
        list_loras = list_prompt_adapters = lambda self: set()

    return StandInExecutor, steps


def run_rpc_server(engine_args, usage_context, rpc_path) -> None:
    """vLLM's run_rpc_server, its engine's executor the stand-in's."""
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    from vllm.entrypoints.openai.rpc import server as rpc

    executor, steps = stand_in_executor(engine_args.block_size)
    AsyncLLMEngine._get_executor_cls = classmethod(lambda cls, config: executor)

    def write_steps(*_) -> None:
        with open(STEP_LOG, "w") as f:
            json.dump(steps, f)

    signal.signal(signal.SIGUSR1, write_steps)
    rpc.run_rpc_server(engine_args, usage_context, rpc_path)


if __name__ == "__main__":
    from stand_in import rpc_argv, serve

    if sys.argv[1:2] == ["rpc"]:  # the engine process under its own interpreter (STAND_IN_ENGINE_PYTHON)
        run_rpc_server(*rpc_argv())
    else:
        serve(run_rpc_server, sys.argv[1:])
