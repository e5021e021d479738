#!/usr/bin/env python3
"""Checks the package layering of megatron/ (docs/architecture.md, "Layers").

The layer table in docs/architecture.md is the single source of truth: each row is a level and
the packages on it (a package is a folder under megatron/core/, a top-level file stem of
megatron/core/, or `training` for megatron/training/). A source file may include headers of its
own package and of packages on LOWER levels only; an include of a package on the same or a higher
level, or of a package the table does not list, is reported as `file:line: <pkg> includes <pkg>`.

  check_layering.py [REPO]            exit 0 iff no violation
  check_layering.py --self-test       checks that the checker reports a planted upward include

Python 3 standard library only.
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"(megatron/[^"]+)"')


def read_levels(doc_path):
    """{package: level} from the '## Layers' table of docs/architecture.md."""
    levels = {}
    in_section = False
    for line in open(doc_path, encoding='utf-8'):
        if line.startswith('## '):
            in_section = line.strip() == '## Layers'
            continue
        m = re.match(r'^\|\s*(\d+)\s*\|(.*)\|\s*$', line) if in_section else None
        if m:
            for pkg in re.findall(r'`([A-Za-z0-9_]+)`', m.group(2).split('|')[0]):
                if pkg in levels:
                    sys.exit(f'{doc_path}: package {pkg} is listed twice in the Layers table')
                levels[pkg] = int(m.group(1))
    if not levels:
        sys.exit(f'{doc_path}: no "## Layers" table (| level | packages | ...) found')
    return levels


def package_of(path):
    """Package of a repository-relative path under megatron/, or None."""
    parts = path.split('/')
    if parts[0] != 'megatron' or len(parts) < 3:
        return None
    if parts[1] == 'training':
        return 'training'
    if parts[1] == 'core':
        return parts[2] if len(parts) > 3 else os.path.splitext(parts[2])[0]
    return parts[1]


def check(repo):
    levels = read_levels(os.path.join(repo, 'docs', 'architecture.md'))
    problems = []
    for root, _, files in os.walk(os.path.join(repo, 'megatron')):
        for name in sorted(files):
            if not name.endswith(('.h', '.cpp', '.cu', '.cuh')):
                continue
            rel = os.path.relpath(os.path.join(root, name), repo).replace(os.sep, '/')
            src = package_of(rel)
            if src not in levels:
                problems.append(f'{rel}:1: package {src} is not in the Layers table of docs/architecture.md')
                continue
            with open(os.path.join(repo, rel), encoding='utf-8', errors='replace') as f:
                for no, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    dst = package_of(m.group(1))
                    if dst is None or dst == src:
                        continue
                    if dst not in levels:
                        problems.append(f'{rel}:{no}: {src} includes {m.group(1)} of unlisted package {dst}')
                    elif levels[dst] >= levels[src]:
                        problems.append(f'{rel}:{no}: {src} (level {levels[src]}) includes {m.group(1)} '
                                        f'({dst}, level {levels[dst]}): a package may include only lower levels')
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, 'docs'))
        os.makedirs(os.path.join(d, 'megatron/core/tensor'))
        os.makedirs(os.path.join(d, 'megatron/core/ops'))
        with open(os.path.join(d, 'docs/architecture.md'), 'w') as f:
            f.write('# x\n## Layers\n| level | packages |\n|---|---|\n| 0 | `tensor` |\n| 1 | `ops` |\n')
        with open(os.path.join(d, 'megatron/core/ops/a.h'), 'w') as f:
            f.write('#include "megatron/core/tensor/t.h"\n')
        if check(d):
            sys.exit('self-test: a downward include was reported')
        with open(os.path.join(d, 'megatron/core/tensor/t.h'), 'w') as f:
            f.write('// ok\n#include "megatron/core/ops/a.h"\n')
        got = check(d)
        if len(got) != 1 or 'megatron/core/tensor/t.h:2: tensor (level 0) includes' not in got[0]:
            sys.exit(f'self-test: the planted upward include was not reported as expected: {got}')
    print('check_layering self-test: an upward include is reported, a downward one is not')


if __name__ == '__main__':
    if sys.argv[1:] == ['--self-test']:
        self_test()
        sys.exit(0)
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
    problems = check(os.path.abspath(repo))
    for p in problems:
        print(p)
    print(f'check_layering: {len(problems)} violation(s)')
    sys.exit(1 if problems else 0)
