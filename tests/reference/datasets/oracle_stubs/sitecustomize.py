# Oracle-only: stand-ins for modules Megatron imports at module level but the dataset code never
# uses (Debian's torch 1.13 lacks torch.distributed.checkpoint etc.).
import importlib.abc, importlib.machinery, sys, types

STUB_PREFIXES = ("torch.distributed.checkpoint", "torch.distributed._tensor", "torch.distributed.tensor",
                 "torch.distributed.fsdp", "torch.distributed._shard", "torch.distributed.device_mesh",
                 "transformer_engine", "apex", "einops", "flash_attn", "opentelemetry",
                 "multistorageclient", "megatron.core.models", "megatron.core.optimizer", "megatron.core.rerun_state_machine", "megatron.core.transformer", "megatron.core.parallel_state", "boto3", "wandb", "tensorstore", "zarr", "nvtx")

class _Any(type):
    def __getattr__(cls, name):
        return _Dummy
class _Dummy(metaclass=_Any):
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Dummy()
    def __getattr__(self, n): return _Dummy

class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(STUB_PREFIXES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None
    def create_module(self, spec):
        m = _StubModule(spec.name); m.__path__ = []; m.__version__ = "0.0.1"; return m
    def exec_module(self, module): pass

sys.meta_path.insert(0, _Finder())

import torch as _torch
for _n in ("float8_e8m0fnu", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if not hasattr(_torch, _n):
        setattr(_torch, _n, _torch.float32 if _n.startswith("float") else _torch.int64)
_torch.jit.script = lambda obj=None, *a, **k: obj
import torch.distributed as _td
for _n in ("DeviceMesh", "init_device_mesh"):
    if not hasattr(_td, _n):
        setattr(_td, _n, _Dummy)
import torch.cuda.memory as _tcm
for _n in ("CUDAPluggableAllocator", "MemPool"):
    if not hasattr(_tcm, _n):
        setattr(_tcm, _n, _Dummy)
