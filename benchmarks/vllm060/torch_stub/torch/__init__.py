"""An inert stand-in for torch, for vLLM 0.6.0's API server process on an interpreter that has no
torch wheel here (CPython 3.10, what the vllm/vllm-openai:v0.6.0 image ran: ``benchmarks/vllm060/
make_env.sh DIR PYTHON`` puts this folder on that environment's path).

The API server process imports vLLM's modules, which import torch throughout (dtypes, nn.Module
subclasses, decorators), but on a request it validates, tokenises and pickles: it computes nothing
with torch. Here every ``torch.X`` (any depth, any ``torch.sub.module``) is a class of its own that
can be subclassed, called, used as a decorator or context manager, and is false; ``version.cuda``
and ``version.hip`` are None (no GPU, no ROCm: vllm.utils.is_hip); ``iinfo`` gives the real 64-bit
bounds (vllm/entrypoints/openai/protocol.py bounds the request's ``seed`` with them). The engine
process, which does use torch, runs on an interpreter with the real one (stand_in.py
``STAND_IN_ENGINE_PYTHON``). transformers sees no torch (no installed distribution), as the
tokeniser path needs none.
"""

import abc
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "2.4.0"  # what vllm==0.6.0 pins
version = types.SimpleNamespace(cuda=None, hip=None, git_version="stub")  # vllm.utils.is_hip: "is not None"


class _Meta(abc.ABCMeta):  # ABCMeta's subclass: vLLM's classes mix nn.Module with ABC
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{cls.__qualname__}.{name}")

    def __bool__(cls) -> bool:
        return False

    def __or__(cls, other):  # ``torch.Tensor | None`` in annotations
        import typing

        return typing.Union[cls, other]  # noqa: UP007 (cls | other would call this method again)

    __ror__ = __or__


class _Stub(metaclass=_Meta):
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # ``@torch.inference_mode()`` and the like: the function itself
        return _Stub()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __bool__(self) -> bool:  # ``torch.cuda.is_available()``, ``torch.version.cuda``: no
        return False

    def __iter__(self):
        return iter(())

    def __getitem__(self, key):
        return _Stub()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


_made: dict[str, type] = {}


def _stub(name: str) -> type:
    """One class per name, so that ``torch.float16 is torch.float16`` and dict keys hold."""
    if name not in _made:
        _made[name] = type(name.rsplit(".", 1)[-1], (_Stub,), {"__module__": "torch", "__qualname__": name})
    return _made[name]


class _Bounds:
    def __init__(self, bits: int) -> None:
        self.bits, self.min, self.max = bits, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def iinfo(dtype) -> _Bounds:
    return _Bounds(64)


def _getattr_of(prefix: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{prefix}.{name}")

    return __getattr__


__getattr__ = _getattr_of("torch")


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import torch.nn.functional`` and every other ``torch.*``: an empty package of stubs."""

    def find_spec(self, fullname, path, target=None):
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True) if fullname.startswith("torch.") else None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _getattr_of(spec.name)
        return module

    def exec_module(self, module) -> None:
        pass


sys.meta_path.insert(0, _Submodules())
