#!/usr/bin/env python3
"""An independent reading and writing of PyTorch Distributed Checkpoint (torch_dist) directories
with the Python standard library only (no torch, no numpy): pickle with stand-in classes named
like torch's, zipfile for torch.save archives. Used by tests/functional_tests/ckpt_torch_dist.sh.

  dcp_stdlib.py compare DCP_DIR OURS_DIR
      Reads every tensor of the torch_dist checkpoint DCP_DIR (its .metadata, each chunk's
      torch.save archive) and of our own-format checkpoint OURS_DIR (safetensors files + JSON
      index), and checks they hold the same values (fp32/bf16 bytes, exactly). Also checks
      common.pt (args as argparse.Namespace, iteration) and the pickles with pickletools.
  dcp_stdlib.py convert OURS_DIR DCP_DIR [--te-names] [--distopt]
      Writes OURS_DIR as a torch_dist checkpoint the way Megatron-LM does (chunks split in two
      along the first axis where possible, args as argparse.Namespace, the optimizer step in
      Megatron's common state, optimizer main params as optimizer.state.param.* with --distopt,
      layer norms under Transformer Engine's fused names with --te-names).
  dcp_stdlib.py keys REF_DIR DCP_DIR
      Checks two torch_dist checkpoints hold the same tensors (key, dtype, global shape) and
      objects, RNG / rerun-state objects aside (our writer against Megatron-LM's own checkpoints),
      and that the objects are alike inside (same_objects: the common state's dict keys, list
      lengths, leaf kinds, the optimizer param groups' identifier values Megatron matches by).
  dcp_stdlib.py values REF_DIR DCP_DIR
      Checks that every tensor of the torch_dist checkpoint REF_DIR is in DCP_DIR with the same
      dtype, shape and bytes (exactly), the main params matched across the two optimizer layouts
      (optimizer.state.param.* of the distributed optimizer = optimizer.state.fp32_param.*): a
      checkpoint loaded and saved again at the same iteration holds what was loaded.
"""
import argparse as _argparse
import array
import collections
import copyreg
import enum
import io
import json
import os
import pickle
import pickletools
import re
import struct
import sys
import types
import zipfile

# ----------------------------------------------------------------------------------------------
# Stand-in modules and classes named like torch's
# ----------------------------------------------------------------------------------------------

def _module(name):
    if name not in sys.modules:
        m = types.ModuleType(name)
        sys.modules[name] = m
        parent, _, child = name.rpartition('.')
        if parent:
            setattr(_module(parent), child, m)
    return sys.modules[name]


def _class(module, name, base=object, **attrs):
    cls = type(name, (base,), dict(attrs))
    cls.__module__ = module
    cls.__qualname__ = name
    setattr(_module(module), name, cls)
    return cls


MD = 'torch.distributed.checkpoint.metadata'


class _Record:
    """Plain attribute bag restored with BUILD (dataclasses)."""
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state

    def __reduce_ex__(self, proto):
        return (copyreg.__newobj__, (type(self),), self.__getstate__())

    def __getstate__(self):
        return dict(self.__dict__)


Metadata = _class(MD, 'Metadata', _Record)
TensorStorageMetadata = _class(MD, 'TensorStorageMetadata', _Record)
BytesStorageMetadata = _class(MD, 'BytesStorageMetadata', _Record)
ChunkStorageMetadata = _class(MD, 'ChunkStorageMetadata', _Record)
StorageMeta = _class(MD, 'StorageMeta', _Record)
StorageInfo = _class('torch.distributed.checkpoint.filesystem', '_StorageInfo', _Record)


class _MetadataIndexBase(_Record):
    # torch pickles MetadataIndex without the fields left at their default (offset=None for
    # byte items), so a missing attribute reads as None.
    def __hash__(self):
        return hash((self.fqn, getattr(self, 'offset', None)))

    def __eq__(self, o):
        return (self.fqn, getattr(self, 'offset', None)) == (o.fqn, getattr(o, 'offset', None))


MetadataIndex = _class(MD, 'MetadataIndex', _MetadataIndexBase)


class _TensorPropertiesBase(_Record):
    def __getstate__(self):  # torch: (dtype, layout, requires_grad, memory-format encoding, pin_memory)
        return (self.dtype, self.layout, self.requires_grad, self.mem, self.pin_memory)

    def __setstate__(self, state):
        self.dtype, self.layout, self.requires_grad, self.mem, self.pin_memory = state


TensorProperties = _class(MD, 'TensorProperties', _TensorPropertiesBase)
MemFormat = enum.Enum('_MEM_FORMAT_ENCODING', {'TORCH_CONTIGUOUS_FORMAT': 0, 'TORCH_CHANNELS_LAST': 1,
                                               'TORCH_PRESERVE_FORMAT': 2}, module=MD)
MemFormat.__qualname__ = '_MEM_FORMAT_ENCODING'
setattr(_module(MD), '_MEM_FORMAT_ENCODING', MemFormat)


class _Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size = _class('torch', 'Size', _Size)


class _DType:
    def __init__(self, name, fmt, size):
        self.name, self.fmt, self.size = name, fmt, size
        self.__module__ = "torch"  # pickle looks the global up as torch.<name>

    def __reduce__(self):
        return self.name  # pickled as the global torch.<name>, like torch.dtype


DTYPES = {}
for _n, _f, _s in [('float32', 'f', 4), ('bfloat16', 'H', 2), ('float16', 'e', 2), ('int64', 'q', 8),
                   ('uint8', 'B', 1)]:
    DTYPES[_n] = _DType(_n, _f, _s)
    setattr(_module('torch'), _n, DTYPES[_n])


class _Layout:
    def __init__(self, name):
        self.name = name


strided = _Layout('torch.strided')
_module('torch').strided = strided


def _get_layout(name):
    return strided


_get_layout.__module__ = 'torch.serialization'
_module('torch.serialization')._get_layout = _get_layout
copyreg.pickle(_Layout, lambda o: (_get_layout, (o.name,)))

STORAGE = {'float32': 'FloatStorage', 'bfloat16': 'BFloat16Storage', 'float16': 'HalfStorage',
           'int64': 'LongStorage', 'uint8': 'ByteStorage'}
STORAGE_CLASSES = {}
for _dt, _cls in STORAGE.items():
    STORAGE_CLASSES[_cls] = _class('torch', _cls)


class Tensor:
    """A row-major tensor: dtype name, shape, raw little-endian bytes."""
    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(shape), bytes(data)

    def __reduce_ex__(self, proto):
        stride, s = [], 1
        for d in reversed(self.shape):
            stride.insert(0, s)
            s *= d
        return (_rebuild_tensor_v2, (_StorageRef(self), 0, tuple(self.shape), tuple(stride), False,
                                     collections.OrderedDict()))


class _StorageRef:
    def __init__(self, t):
        self.t = t


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, *rest):
    dtype, data = storage
    esz = DTYPES[dtype].size
    out = bytearray()
    n = 1
    for d in size:
        n *= d
    idx = [0] * len(size)
    for _ in range(n):
        src = offset + sum(i * s for i, s in zip(idx, stride))
        out += data[src * esz:(src + 1) * esz]
        for k in reversed(range(len(size))):
            idx[k] += 1
            if idx[k] < size[k]:
                break
            idx[k] = 0
    return Tensor(dtype, size, out)


_rebuild_tensor_v2.__module__ = 'torch._utils'
_module('torch._utils')._rebuild_tensor_v2 = _rebuild_tensor_v2
Namespace = _argparse.Namespace

# ----------------------------------------------------------------------------------------------
# torch.save archives
# ----------------------------------------------------------------------------------------------

def torch_save_bytes(obj, archive='archive'):
    storages = []

    class P(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, _StorageRef):
                storages.append(o.t)
                t = o.t
                return ('storage', STORAGE_CLASSES[STORAGE[t.dtype]], str(len(storages) - 1), 'cpu',
                        len(t.data) // DTYPES[t.dtype].size)
            return None

    buf = io.BytesIO()
    P(buf, protocol=2).dump(obj)
    out = io.BytesIO()
    with zipfile.ZipFile(out, 'w', zipfile.ZIP_STORED) as z:
        z.writestr(archive + '/data.pkl', buf.getvalue())
        z.writestr(archive + '/byteorder', 'little')
        for i, t in enumerate(storages):
            z.writestr(f'{archive}/data/{i}', t.data)
        z.writestr(archive + '/version', '3\n')
    return out.getvalue()


def torch_load_bytes(data):
    z = zipfile.ZipFile(io.BytesIO(data))
    names = z.namelist()
    prefix = names[0].split('/')[0] + '/'
    assert all(n.startswith(prefix) for n in names), names
    assert z.read(prefix + 'version') in (b'3\n', b'3'), z.read(prefix + 'version')
    assert z.testzip() is None, 'CRC mismatch'
    pkl = z.read(prefix + 'data.pkl')
    pickletools.dis(pkl, out=io.StringIO())  # well-formed for the stdlib disassembler

    class U(pickle.Unpickler):
        def persistent_load(self, pid):
            assert pid[0] == 'storage', pid
            dtype = {v: k for k, v in STORAGE.items()}[pid[1].__name__]
            return (dtype, z.read(prefix + 'data/' + pid[2]))

        def find_class(self, module, name):
            if module.split('.')[0] == 'megatron' and module not in sys.modules:
                return _foreign(module, name)
            return super().find_class(module, name)

    return U(io.BytesIO(pkl)).load()


_FOREIGN = {}


class _Foreign:
    """Stand-in for a class of Megatron-LM's own in its common state (the enums in args and in
    rerun_state_machine: AttnBackend, RerunMode, ...): keeps the constructor arguments / state."""
    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return f'{type(self).__module__}.{type(self).__name__}{self.args}'


def _foreign(module, name):
    if (module, name) not in _FOREIGN:
        _FOREIGN[module, name] = type(name, (_Foreign,), {'__module__': module, '__qualname__': name})
    return _FOREIGN[module, name]


# ----------------------------------------------------------------------------------------------
# Our own format (safetensors + JSON index)
# ----------------------------------------------------------------------------------------------

ST_DTYPE = {'F32': 'float32', 'BF16': 'bfloat16', 'F16': 'float16', 'I64': 'int64', 'U8': 'uint8'}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def flat_index(idx, shape):
    f = 0
    for i, d in zip(idx, shape):
        f = f * d + i
    return f


def paste(dst, gshape, src, off, shape, esz, flat=None):
    """Copies box `src` (shape at global offset off; flat range [b, e) of it if flat) into dst."""
    b, e = flat if flat else (0, numel(shape))
    for k in range(b, e):
        idx, r = [], k
        for d in reversed(shape):
            idx.insert(0, r % d)
            r //= d
        g = flat_index([i + o for i, o in zip(idx, off)], gshape)
        dst[g * esz:(g + 1) * esz] = src[(k - b) * esz:(k - b + 1) * esz]


def read_ours(d):
    idx = json.load(open(os.path.join(d, '.metadata')))
    out = {}
    for key, t in idx['tensors'].items():
        dt = ST_DTYPE[t['dtype']]
        esz = DTYPES[dt].size
        buf = bytearray(numel(t['global_shape']) * esz)
        for s in t['shards']:
            with open(os.path.join(d, s['file']), 'rb') as f:
                f.seek(s['byte_range'][0])
                raw = f.read(s['byte_range'][1] - s['byte_range'][0])
            paste(buf, t['global_shape'], raw, s['global_offset'], s['local_shape'], esz, s.get('flattened_range'))
        out[key] = Tensor(dt, t['global_shape'], buf)
    common = json.load(open(os.path.join(d, 'common.json')))
    return out, common


def read_dcp(d):
    assert json.load(open(os.path.join(d, 'metadata.json')))['sharded_backend'] == 'torch_dist'
    raw = open(os.path.join(d, '.metadata'), 'rb').read()
    pickletools.dis(raw, out=io.StringIO())
    md = pickle.loads(raw)
    assert type(md).__name__ == 'Metadata', type(md)
    out = {}
    for key, sm in md.state_dict_metadata.items():
        if isinstance(sm, BytesStorageMetadata):
            continue
        dt = sm.properties.dtype.name
        esz = DTYPES[dt].size
        buf = bytearray(numel(sm.size) * esz)
        covered = 0
        for c in sm.chunks:
            info = md.storage_data[MetadataIndex(fqn=key, offset=Size(c.offsets))]
            with open(os.path.join(d, info.relative_path), 'rb') as f:
                f.seek(info.offset)
                t = torch_load_bytes(f.read(info.length))
            assert t.shape == tuple(c.sizes) or numel(t.shape) == numel(c.sizes), (key, t.shape, c.sizes)
            assert t.dtype == dt, (key, t.dtype, dt)
            paste(buf, sm.size, t.data, c.offsets, c.sizes, esz)
            covered += numel(c.sizes)
        assert covered == numel(sm.size), f'{key}: chunks cover {covered} of {numel(sm.size)}'
        out[key] = Tensor(dt, sm.size, buf)
    cp = os.path.join(d, 'common.pt')  # Megatron-LM since July 2026 writes none (common_state object)
    common = torch_load_bytes(open(cp, 'rb').read()) if os.path.exists(cp) else None
    return out, common, md


def compare(dcp_dir, ours_dir):
    dcp, common, md = read_dcp(dcp_dir)
    ours, ocommon = read_ours(ours_dir)
    # The distributed optimizer's main params are named as Megatron's fully_reshardable layout;
    # layer norms under the fused names Megatron's layer saves them as; fp32 training saves no
    # main-param copy (Megatron's FP32Optimizer): ours must equal the model weight then.
    def ours_name(k):
        k = k.replace('optimizer.state.param.', 'optimizer.state.fp32_param.')
        k = k.replace('decoder.layers.self_attention.linear_qkv.layer_norm_', 'decoder.layers.input_layernorm.')
        return k.replace('decoder.layers.mlp.linear_fc1.layer_norm_', 'decoder.layers.pre_mlp_layernorm.')
    ren = {ours_name(k): v for k, v in dcp.items()}
    for k in list(ours):
        p = 'optimizer.state.fp32_param.'
        if k.startswith(p) and k not in ren and ours[k[len(p):]].dtype == 'float32':
            assert ours[k].data == ours[k[len(p):]].data, f'{k}: main param differs from the fp32 weight'
            del ours[k]
    assert set(ren) == set(ours), f'keys differ: {sorted(set(ren) ^ set(ours))[:10]}'
    for k, t in ours.items():
        assert ren[k].shape == tuple(t.shape), (k, ren[k].shape, t.shape)
        assert ren[k].data == t.data, f'{k}: values differ'
    assert isinstance(common['args'], Namespace), type(common['args'])
    assert common['iteration'] == ocommon['iteration'], (common['iteration'], ocommon['iteration'])
    assert common['args'].num_layers == ocommon['args']['num_layers']
    extra = [k for k in md.state_dict_metadata if k.endswith(('_extra_state/shard_0_2', '_extra_state/shard_1_2'))]
    assert extra, 'no _extra_state objects'
    print(f'OK: {len(ours)} tensors equal, {len(extra)} _extra_state objects, iteration {common["iteration"]}')


def same_keys(ref_dir, dcp_dir):
    """The tensors (key, dtype, global shape) and objects of two torch_dist checkpoints agree,
    except the RNG / rerun-state objects (torch generators; megatron.cpp keeps its own RNG state
    under megatron_cpp.*), which only the writer's own code reads."""
    def entries(d):
        md = pickle.loads(open(os.path.join(d, '.metadata'), 'rb').read())
        out = set()
        for k, sm in md.state_dict_metadata.items():
            if k.startswith(('rng_state/', 'rerun_state_machine_state/', 'megatron_cpp.')):
                continue
            out.add((k, 'bytes') if isinstance(sm, BytesStorageMetadata) else
                    (k, sm.properties.dtype.name, tuple(sm.size)))
        return out
    a, b = entries(ref_dir), entries(dcp_dir)
    assert a == b, f'only in {ref_dir}: {sorted(a - b)[:8]}; only in {dcp_dir}: {sorted(b - a)[:8]}'
    diffs = same_objects(ref_dir, dcp_dir)
    for line in diffs[:20]:
        print(f'object differs: {line}')
    assert not diffs, f'{len(diffs)} difference(s) inside the objects of {ref_dir} and {dcp_dir}'
    n = sum(1 for e in a if e[1] == 'bytes')
    print(f'OK: the same {len(a)} entries (key, dtype, shape), the {n} objects alike inside')


def read_objects(d, skip=()):
    """The objects (BytesStorageMetadata entries) of torch_dist checkpoint d whose keys do not
    start with one of `skip`: {key: value}, each read with torch_load_bytes (the common_state
    object, the None _extra_state objects, ...)."""
    md = pickle.loads(open(os.path.join(d, '.metadata'), 'rb').read())
    out = {}
    for idx, info in md.storage_data.items():
        if isinstance(md.state_dict_metadata.get(idx.fqn), BytesStorageMetadata) and not idx.fqn.startswith(skip):
            with open(os.path.join(d, info.relative_path), 'rb') as f:
                f.seek(info.offset)
                out[idx.fqn] = torch_load_bytes(f.read(info.length))
    return out


# Megatron-LM matches a saved optimizer param group to its own by these entries' values
# (optimizer.py param_group_identifier_keys, _filter_and_reorder_param_groups).
PARAM_GROUP_IDS = ('end_wd', 'max_lr', 'min_lr', 'optimizer', 'start_wd', 'wd_mult', 'lr_mult',
                   'is_expert_parallel', 'is_decoupled_lr')
# The args Megatron-LM's load reads from the checkpoint's Namespace without a default
# (checkpointing.py check_checkpoint_args, with --vocab-file / Megatron's legacy format).
CHECKED_ARGS = ('num_layers', 'hidden_size', 'num_attention_heads', 'max_position_embeddings',
                'make_vocab_size_divisible_by', 'tokenizer_type', 'tensor_model_parallel_size',
                'pipeline_model_parallel_size')


def object_diffs(a, b, path=''):
    """Where two unpickled objects differ in structure: dict keys (their Python type too: the
    ChainedOptimizer's int keys), list / tuple lengths, the kind of each leaf (a number, bool, str,
    None, a tensor's dtype and shape, a class by name), and the values of the param groups'
    identifier entries (PARAM_GROUP_IDS, under a 'param_groups' list). An argparse.Namespace is
    compared on CHECKED_ARGS only. Returns a list of 'path: what' lines."""
    def kind(v):
        if v is None or isinstance(v, (bool, str)):
            return type(v).__name__
        if isinstance(v, (int, float)):
            return 'number'
        if isinstance(v, Tensor):
            return f'tensor {v.dtype} {list(v.shape)}'
        if isinstance(v, (dict, list, tuple, Namespace)):
            return type(v).__name__
        return f'{type(v).__module__}.{type(v).__qualname__}'
    if kind(a) != kind(b):
        return [f'{path or "/"}: {kind(a)} vs {kind(b)}']
    out = []
    if isinstance(a, Namespace):
        for k in CHECKED_ARGS:
            out += object_diffs(getattr(a, k, '<missing>'), getattr(b, k, '<missing>'), f'{path}.{k}')
    elif isinstance(a, dict):
        ka, kb = {(type(k).__name__, k) for k in a}, {(type(k).__name__, k) for k in b}
        for t, k in sorted(ka - kb, key=str):
            out.append(f'{path}[{k!r}]: only in the first')
        for t, k in sorted(kb - ka, key=str):
            out.append(f'{path}[{k!r}]: only in the second')
        in_group = re.search(r"\['param_groups'\]\[\d+\]$", path) is not None
        for t, k in sorted(ka & kb, key=str):
            if in_group and k in PARAM_GROUP_IDS and a[k] != b[k]:
                out.append(f'{path}[{k!r}]: {a[k]!r} vs {b[k]!r} (an identifier Megatron matches groups by)')
            out += object_diffs(a[k], b[k], f'{path}[{k!r}]')
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f'{path}: {len(a)} vs {len(b)} items']
        for i, (x, y) in enumerate(zip(a, b)):
            out += object_diffs(x, y, f'{path}[{i}]')
    return out


def same_objects(ref_dir, dcp_dir):
    """The objects of two torch_dist checkpoints have the same inner structure (object_diffs),
    the common state's entries that only one writer has aside: megatron.cpp's own
    (megatron_cpp_*) and Megatron-LM's rerun_state_machine, which its load reads only when
    present (checkpointing.py load_checkpoint). RNG / rerun-state objects are skipped as in
    same_keys. Returns the difference lines."""
    skip = ('rng_state/', 'rerun_state_machine_state/', 'megatron_cpp.')
    a, b = (read_objects(d, skip) for d in (ref_dir, dcp_dir))

    def common(v):
        v = v[0] if isinstance(v, list) and len(v) == 1 else v
        assert isinstance(v, dict), type(v)
        return {k: x for k, x in v.items() if not (isinstance(k, str) and k.startswith(('megatron_cpp', 'rerun_state_machine')))}
    out = []
    for k in sorted(set(a) & set(b)):
        x, y = (common(a[k]), common(b[k])) if k.startswith('common_state/') else (a[k], b[k])
        out += object_diffs(x, y, k)
    return out


def same_values(ref_dir, dcp_dir):
    """Every tensor of ref_dir is in dcp_dir, bytes equal (main params matched across the
    distributed / non-distributed optimizer names); prints the count and any difference."""
    ref, _, _ = read_dcp(ref_dir)
    got, _, _ = read_dcp(dcp_dir)
    main = ('optimizer.state.param.', 'optimizer.state.fp32_param.')
    def find(k):
        if k in got:
            return k
        for a, b in (main, main[::-1]):
            if k.startswith(a) and b + k[len(a):] in got:
                return b + k[len(a):]
        return None
    missing = [k for k in ref if find(k) is None]
    bad = [k for k in ref if find(k) and (got[find(k)].dtype != ref[k].dtype or got[find(k)].shape != ref[k].shape
                                         or got[find(k)].data != ref[k].data)]
    for k in missing[:10]:
        print(f'missing in {dcp_dir}: {k}')
    for k in bad[:10]:
        g = got[find(k)]
        print(f'differs: {k} ({ref[k].dtype} {ref[k].shape} vs {g.dtype} {g.shape})')
    print(f'{"OK" if not missing and not bad else "FAIL"}: {len(ref) - len(missing) - len(bad)} of {len(ref)} '
          f'tensors of {ref_dir} equal bitwise in {dcp_dir} ({len(missing)} missing, {len(bad)} differ)')
    return not missing and not bad


def convert(ours_dir, dcp_dir, te_names, distopt):
    ours, oc = read_ours(ours_dir)
    os.makedirs(dcp_dir, exist_ok=True)
    sdm, storage = {}, {}
    fname = '__0_0.distcp'
    with open(os.path.join(dcp_dir, fname), 'wb') as f:
        for key, t in ours.items():
            k = key
            if te_names:
                k = k.replace('decoder.layers.input_layernorm.', 'decoder.layers.self_attention.linear_qkv.layer_norm_')
                k = k.replace('decoder.layers.pre_mlp_layernorm.', 'decoder.layers.mlp.linear_fc1.layer_norm_')
            if distopt:
                k = k.replace('optimizer.state.fp32_param.', 'optimizer.state.param.')
            esz = DTYPES[t.dtype].size
            shape = list(t.shape)
            # Two chunks along the first axis when it has at least 2 rows.
            cuts = [0, shape[0] // 2, shape[0]] if shape and shape[0] >= 2 else [0, shape[0] if shape else 1]
            row = numel(shape[1:]) * esz
            chunks = []
            for a, b in zip(cuts, cuts[1:]):
                cs = [b - a] + shape[1:]
                co = [a] + [0] * (len(shape) - 1)
                data = torch_save_bytes(Tensor(t.dtype, cs, t.data[a * row:b * row]))
                storage[MetadataIndex(fqn=k, offset=Size(co), index=len(chunks))] = StorageInfo(
                    relative_path=fname, offset=f.tell(), length=len(data))
                f.write(data)
                chunks.append(ChunkStorageMetadata(offsets=Size(co), sizes=Size(cs)))
            props = TensorProperties()
            props.dtype, props.layout, props.requires_grad = DTYPES[t.dtype], strided, False
            props.mem, props.pin_memory = MemFormat.TORCH_CONTIGUOUS_FORMAT, False
            sdm[k] = TensorStorageMetadata(properties=props, size=Size(shape), chunks=chunks)
        blob = torch_save_bytes([None])
        for k in ['decoder.layers.self_attention.linear_qkv._extra_state/shard_0_2']:
            storage[MetadataIndex(fqn=k, offset=None, index=None)] = StorageInfo(
                relative_path=fname, offset=f.tell(), length=len(blob))
            f.write(blob)
            sdm[k] = BytesStorageMetadata()
    md = Metadata(state_dict_metadata=sdm, planner_data={}, storage_data=storage,
                  storage_meta=StorageMeta(checkpoint_id=dcp_dir, save_id='x', load_id=None, modules=[]),
                  version='1.0.0')
    with open(os.path.join(dcp_dir, '.metadata'), 'wb') as f:
        pickle.dump(md, f, protocol=4)
    args = Namespace(**oc['args'])
    step = oc['optimizer']['step']
    common = {'args': args, 'checkpoint_version': 3.0, 'iteration': oc['iteration'],
              'optimizer': {'optimizer': {'param_groups': [{'lr': 1e-3, 'step': step, 'params': [0, 1]}]},
                            'param_state_sharding_type': 'fully_reshardable'} if distopt else
                           {'optimizer': {'state': {'common_step': step}, 'param_groups': [{'params': [0]}]}},
              'opt_param_scheduler': oc['opt_param_scheduler'],
              'num_floating_point_operations_so_far': oc.get('num_floating_point_operations_so_far', 0),
              'content_metadata': {'distrib_optim_sharding_type': 'fully_reshardable'}}
    with open(os.path.join(dcp_dir, 'common.pt'), 'wb') as f:
        f.write(torch_save_bytes(common, 'common'))
    with open(os.path.join(dcp_dir, 'metadata.json'), 'w') as f:
        json.dump({'sharded_backend': 'torch_dist', 'sharded_backend_version': 1}, f)
    print(f'wrote {len(sdm)} entries to {dcp_dir}')


if __name__ == '__main__':
    p = _argparse.ArgumentParser()
    p.add_argument('mode', choices=['compare', 'convert', 'keys', 'values'])
    p.add_argument('src')
    p.add_argument('dst')
    p.add_argument('--te-names', action='store_true')
    p.add_argument('--distopt', action='store_true')
    a = p.parse_args()
    if a.mode == 'compare':
        compare(a.src, a.dst)
    elif a.mode == 'keys':
        same_keys(a.src, a.dst)
    elif a.mode == 'values':
        sys.exit(0 if same_values(a.src, a.dst) else 1)
    else:
        convert(a.src, a.dst, a.te_names, a.distopt)
