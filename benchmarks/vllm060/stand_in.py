"""vLLM 0.6.0's own OpenAI API server with a stand-in engine, for benchmarks/vllm060_server_intake.py.

Run with the interpreter of benchmarks/vllm060/make_env.sh's virtualenv (vLLM 0.6.0's code):

    ENV/bin/python benchmarks/vllm060/stand_in.py model DIR (--tokenizer-json FILE | --llama3 tokenizer.model)
    STAND_IN_N=500 STAND_IN_LOG=out.json ENV/bin/python benchmarks/vllm060/stand_in.py serve --model DIR --port P ...
    STAND_IN_ENGINE_PYTHON=ENV/bin/python SERVER_ENV/bin/python benchmarks/vllm060/stand_in.py serve ...

``model``: a model folder with no weights (Llama-3-8B's config.json, a tokenizer) for vLLM to load.
``serve``: vllm/entrypoints/openai/api_server.py run as its ``__main__`` runs it (``asyncio.run(run_server(args))``),
its own front end process and RPC client (ZeroMQ, cloudpickle) unchanged; only the engine process
differs: vLLM's own ``AsyncEngineRPCServer`` (its socket, its handler per message) around a
stand-in engine that stamps when each request reaches it (``time.perf_counter``: CLOCK_MONOTONIC,
one clock for every process) and answers nothing until all ``STAND_IN_N`` requests of the burst
are in (the real engine is prefilling by then), then one finished token each. The first request
(the client's warm-up) is answered at once. When the last request is in, it writes the stamps and
the API server's CPU seconds to ``STAND_IN_LOG``. With ``STAND_IN_ENGINE_PYTHON`` the API server
runs on one interpreter (make_env.sh's with PYTHON: CPython 3.10, torch a stub) and the engine
process on that one (make_env.sh's without: it needs torch): vLLM's spawned engine process execs it.
"""

import asyncio
import json
import os
import sys
import time

N = int(os.environ.get("STAND_IN_N", "500"))
LOG = os.environ.get("STAND_IN_LOG", "stand_in.json")


def process_cpu_seconds(pid: int, thread: int | None = None) -> float:
    """utime + stime of ``pid`` (/proc/PID/stat), or of its ``thread`` alone (the main thread: ``pid``)."""
    with open(f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StandInEngine:
    """What vLLM's RPC server asks of an AsyncLLMEngine: its configs, and ``generate``."""

    def __init__(self, engine_args) -> None:
        self.config = engine_args.create_engine_config()
        self.stamps: list[float] = []
        self.all_in = asyncio.Event()

    async def get_model_config(self): return self.config.model_config  # noqa: E704
    async def get_decoding_config(self): return self.config.decoding_config  # noqa: E704
    async def get_lora_config(self): return self.config.lora_config  # noqa: E704
    async def get_scheduler_config(self): return self.config.scheduler_config  # noqa: E704
    async def get_parallel_config(self): return self.config.parallel_config  # noqa: E704
    async def is_tracing_enabled(self): return False  # noqa: E704
    async def do_log_stats(self): return None  # noqa: E704
    async def check_health(self): return None  # noqa: E704
    async def abort(self, request_id): return None  # noqa: E704

    async def generate(self, inputs, sampling_params, request_id, **kwargs):
        from vllm.outputs import CompletionOutput, RequestOutput

        self.stamps.append(time.perf_counter())
        if len(self.stamps) == N + 1:  # the burst's last: the stamps and the API server's CPU now
            server = os.getppid()
            record = {"stamps": self.stamps[1:], "server_cpu_s": process_cpu_seconds(server),
                      "server_loop_cpu_s": process_cpu_seconds(server, thread=server)}  # fmt: skip
            with open(LOG, "w") as f:  # noqa: ASYNC230 (once, after the burst is all in)
                json.dump(record, f)
            self.all_in.set()
        elif len(self.stamps) > 1:
            await self.all_in.wait()
        ids = inputs["prompt_token_ids"]
        done = CompletionOutput(index=0, text=" x", token_ids=[1], cumulative_logprob=None, logprobs=None,
                                finish_reason="length")
        yield RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=ids, prompt_logprobs=None,
                            outputs=[done], finished=True)


def run_engine_elsewhere(engine_args, usage_context, rpc_path) -> None:
    """In place of run_rpc_server in vLLM's spawned engine process, where ``STAND_IN_ENGINE_PYTHON``
    names the engine's interpreter: the same process (its pid, which the API server stops at exit)
    turned into that interpreter running the same script as ``SCRIPT rpc RPC_PATH <the server's
    arguments>`` (multiprocessing's spawn hands the child the parent's ``sys.argv``), which the
    script reads back with ``rpc_argv``. Here and in real_engine.py."""
    python = os.environ["STAND_IN_ENGINE_PYTHON"]
    server_args = sys.argv[2:] if sys.argv[1:2] == ["serve"] else sys.argv[1:]
    os.execv(python, [python, sys.argv[0], "rpc", rpc_path, *server_args])


def server_args(argv: list[str]):
    """``argv`` read as vLLM's OpenAI server reads its command line."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


def rpc_argv():
    """``(engine_args, usage_context, rpc_path)`` for run_rpc_server from run_engine_elsewhere's
    command line."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    return AsyncEngineArgs.from_cli_args(server_args(sys.argv[3:])), UsageContext.OPENAI_API_SERVER, sys.argv[2]


def serve(engine_process, argv: list[str]) -> None:
    """vllm/entrypoints/openai/api_server.py as its ``__main__`` runs it, on ``argv``, its engine
    process ``engine_process`` (in place of run_rpc_server), or run_engine_elsewhere where
    ``STAND_IN_ENGINE_PYTHON`` names the engine's interpreter. Here and in real_engine.py."""
    import vllm.entrypoints.openai.api_server as api

    api.run_rpc_server = run_engine_elsewhere if os.environ.get("STAND_IN_ENGINE_PYTHON") else engine_process
    asyncio.run(api.run_server(server_args(argv)))


def run_stand_in_rpc_server(engine_args, usage_context, rpc_path) -> None:
    """In place of vllm.entrypoints.openai.rpc.server.run_rpc_server (the engine process)."""
    import uvloop
    import zmq
    import zmq.asyncio
    from vllm.entrypoints.openai.rpc import server as rpc

    class StandInRPCServer(rpc.AsyncEngineRPCServer):
        def __init__(self) -> None:  # vLLM's, with the stand-in for AsyncLLMEngine.from_engine_args
            self.engine = StandInEngine(engine_args)
            self.context = zmq.asyncio.Context()
            self.socket = self.context.socket(zmq.constants.DEALER)
            self.socket.set_hwm(rpc.VLLM_RPC_ZMQ_HWM)
            self.socket.connect(rpc_path)

        def cleanup(self) -> None:
            self.socket.close()
            self.context.destroy()

    uvloop.run(rpc.run_server(StandInRPCServer()))


def make_model(folder: str, tokenizer_json: str | None, llama3: str | None) -> None:
    """Llama-3-8B's config.json and a tokenizer, written by this environment's transformers."""
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    if llama3:
        from transformers.convert_slow_tokenizer import TikTokenConverter

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from vllm_frontend_burst import LLAMA3_SPLIT

        tok = TikTokenConverter(vocab_file=llama3, pattern=LLAMA3_SPLIT).converted()
    else:
        tok = Tokenizer.from_file(tokenizer_json)
    bos = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken("<|begin_of_text|>", special=True), AddedToken("<|end_of_text|>", special=True)])
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   model_max_length=8192)
    fast.save_pretrained(folder)
    config = LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         rope_theta=500000.0, torch_dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)


if __name__ == "__main__":
    if sys.argv[1:2] == ["model"]:
        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("folder")
        p.add_argument("--tokenizer-json")
        p.add_argument("--llama3")
        a = p.parse_args(sys.argv[2:])
        make_model(a.folder, a.tokenizer_json, a.llama3)
    elif sys.argv[1:2] == ["serve"]:
        serve(run_stand_in_rpc_server, sys.argv[2:])
    elif sys.argv[1:2] == ["rpc"]:  # run_engine_elsewhere's
        run_stand_in_rpc_server(*rpc_argv())
    else:
        sys.exit(__doc__)
