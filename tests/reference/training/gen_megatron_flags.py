#!/usr/bin/env python3
"""Dumps the names and arities of every flag of Megatron-LM's pretraining parser.

Usage: /usr/bin/python3 gen_megatron_flags.py /path/to/Megatron-LM > megatron/training/megatron_flag_names.inc

Megatron is run as an oracle: its add_megatron_arguments() builds the argparse parser, and we
read the parser's actions. Heavy dependencies (torch, transformer_engine, ...) are replaced by
inert stand-ins because only the flag declarations are needed. The output is a list of facts
(flag name, number of values, argparse dest, str() of the default, kind), used by
megatron/training/arguments.cpp to tell "a Megatron flag we do not implement" from "a typo", to
suggest the closest flag, and to print the arguments block (_print_args) under Megatron's dest
names. kind: 'T' store_true, 'F' store_false, 'B' BooleanOptionalAction, 'i' int, 'f' float,
'e' enum (printed as str(Enum member), e.g. AttnBackend.flash), 's' anything else.
"""
import argparse, functools, json, importlib.abc, importlib.machinery, re, sys, types, typing

if not hasattr(typing, "override"):
    typing.override = lambda f: f


class _Base:
    def __init__(self, *a, **k): pass
    def __init_subclass__(cls, **k): pass


class _Any:
    """An object that tolerates any use (attribute, call, subscript, base class)."""
    def __init__(self, n='x'): self._n = n
    def __getattr__(self, n):
        if n.startswith('__'): raise AttributeError(n)
        return _Any(n)
    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k and not isinstance(a[0], _Any): return a[0]
        return _Any('r')
    def __getitem__(self, k): return _Any('i')
    def __or__(self, o): return self
    def __ror__(self, o): return self
    def __iter__(self): return iter(())
    def __bool__(self): return False
    def __int__(self): return 0
    def __index__(self): return 0
    def __float__(self): return 0.0
    def __lt__(self, o): return False
    def __gt__(self, o): return False
    def __le__(self, o): return True
    def __ge__(self, o): return True
    def __hash__(self): return id(self)
    def __eq__(self, o): return self is o
    def __enter__(self): return self
    def __exit__(self, *a): return False
    def __mro_entries__(self, bases): return (_Base,)


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        def ga(name):
            if name == '__version__': return '99.0.0'
            if name.startswith('__'): raise AttributeError(name)
            return _Any(name)
        m.__getattr__ = ga
        return m
    def exec_module(self, module): pass


_HEAVY = ('torch', 'numpy', 'triton', 'einops', 'transformer_engine', 'apex')


class _First(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == 'megatron.rl' or name.startswith('megatron.rl.') or name.split('.')[0] in _HEAVY:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


class _Last(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split('.')[0]
        if top == 'megatron' or name.startswith('_') or top in sys.stdlib_module_names:
            return None
        return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)


@functools.total_ordering
class _Version:
    def __init__(self, s):
        self.t = tuple(int(x) for x in re.findall(r'\d+', str(s))[:3])
        self.major = self.t[0] if self.t else 0
        self.minor = self.t[1] if len(self.t) > 1 else 0
    def __eq__(self, o): return self.t == (o.t if isinstance(o, _Version) else _Version(o).t)
    def __lt__(self, o): return self.t < (o.t if isinstance(o, _Version) else _Version(o).t)
    def __hash__(self): return hash(self.t)


def install_stubs(megatron_dir):
    """Makes `import megatron...` work without torch & co (flag declarations and pure-Python
    helpers only). Also used by gen_scheduler.py."""
    sys.meta_path.insert(0, _First())
    sys.meta_path.append(_Last())
    pk = types.ModuleType('packaging'); pk.__path__ = []
    pv = types.ModuleType('packaging.version'); pv.Version = _Version; pv.parse = _Version; pk.version = pv
    sys.modules['packaging'] = pk; sys.modules['packaging.version'] = pv
    sys.path.insert(0, megatron_dir)


def main():
    install_stubs(sys.argv[1])
    from megatron.training import arguments
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    rows = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        if a.nargs in (None,):
            arity = 1
        elif a.nargs == 0:
            arity = 0
        elif isinstance(a.nargs, int):
            arity = a.nargs
        else:
            arity = -1  # '*' or '+'
        if isinstance(a, argparse._StoreTrueAction):
            kind = 'T'
        elif isinstance(a, argparse._StoreFalseAction):
            kind = 'F'
        elif isinstance(a, argparse.BooleanOptionalAction):
            kind = 'B'
        elif a.type is int:
            kind = 'i'
        elif a.type is float:
            kind = 'f'
        elif getattr(a.type, '__name__', '') == 'enum_type_handler':
            kind = 'e'
        else:
            kind = 's'
        for o in a.option_strings:
            if o.startswith('--'):
                rows.append((o, arity, a.dest, str(a.default), kind))
    print('// Generated by tests/reference/training/gen_megatron_flags.py from Megatron-LM\'s parser:')
    print('// every flag of pretrain_gpt.py: name, number of values (-1 = one or more), argparse dest,')
    print('// str() of its default, kind (T store_true, F store_false, B BooleanOptional, i int, f float,')
    print('// e enum, s other). Facts only.')
    for o, n, dest, default, kind in sorted(set(rows)):
        print(f'{{"{o}", {n}, "{dest}", {json.dumps(default)}, \'{kind}\'}},')

if __name__ == '__main__':
    main()
