#!/usr/bin/env python3
"""Checks that the dropout-free flash attention kernels compile to the same PTX as at REV.

Usage: tools/dev/flash_ptx_same.py BUILD_CUDA_DIR [REV]   (REV default: main; needs nvcc, no GPU)

Compiles megatron/core/ops/cuda/attention.cu of REV and of the working tree to sm_90a PTX with the
build dir's flags, and compares every kernel of REV with the working tree's kernel of the same name
(a kernel that gained a trailing `bool kDrop` template argument is compared as <..., false>), after
renaming registers and labels in order of first use and ignoring .loc lines, register declarations
and the size of the by-value FaArgs parameter (fields appended at its end). Prints one line per
kernel; exit status 0 iff every kernel is identical. docs/cuda.md "Attention" states the claim this
checks: attention dropout support leaves the dropout-0 kernels' code unchanged.
"""
import os
import re
import subprocess
import sys
import tempfile


def compile_ptx(build, src, out):
    cmd = subprocess.run(['ninja', '-C', build, '-t', 'commands',
                          'CMakeFiles/megatron_cuda.dir/megatron/core/ops/cuda/attention.cu.o'],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    cmd = re.sub(r'-MD -MT \S+ -MF \S+', '', cmd)
    cmd = re.sub(r'-gencode=\S+', '', cmd)
    cmd = re.sub(r' -o \S+attention\.cu\.o', '', cmd)
    cmd = re.sub(r' -c \S+attention\.cu', '', cmd)
    cmd = re.sub(r'^\S*ccache ', '', cmd)
    subprocess.run(cmd + ' -arch=compute_90a -ptx -o %s -c %s' % (out, src), shell=True, cwd=build, check=True)


def kernels(path):
    txt = open(path).read()
    d = {}
    for m in re.finditer(r'\.entry (\S+)\((.*?)\n\}\n', txt, re.S):
        name = subprocess.run(['c++filt', m.group(1)], capture_output=True, text=True).stdout.strip()
        name = re.sub(r'megatron::ops::cuda::\(anonymous namespace\)::', '', name)
        name = re.sub(r'\(.*', '', name)
        body = m.group(2).replace(m.group(1), 'FN')
        body = re.sub(r'_ZN\w+', 'SYM', body)
        body = re.sub(r'\n\s*\.loc[^\n]*', '', body)
        body = re.sub(r'\n\$L__tmp\d+:', '', body)
        body = re.sub(r'(_param_\d+)\[\d+\]', r'\1[N]', body)
        body = '\n'.join(l for l in body.split('\n') if not re.match(r'\s*\.reg ', l))
        names = {}
        body = re.sub(r'%(f|r|rd|p|rs)\d+|\$L__BB\d+_\d+', lambda t: names.setdefault(t.group(0), 'R%d' % len(names)), body)
        d[name] = body
    return d


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    rev = sys.argv[2] if len(sys.argv) > 2 else 'main'
    root = subprocess.run(['git', 'rev-parse', '--show-toplevel'], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        old_src = os.path.join(tmp, 'attention_rev.cu')
        with open(old_src, 'w') as f:
            f.write(subprocess.run(['git', '-C', root, 'show', rev + ':megatron/core/ops/cuda/attention.cu'],
                                   capture_output=True, text=True, check=True).stdout)
        compile_ptx(build, old_src, os.path.join(tmp, 'old.ptx'))
        compile_ptx(build, os.path.join(root, 'megatron/core/ops/cuda/attention.cu'), os.path.join(tmp, 'new.ptx'))
        old, new = kernels(os.path.join(tmp, 'old.ptx')), kernels(os.path.join(tmp, 'new.ptx'))
    bad = 0
    for name, body in sorted(old.items()):
        cand = [name, re.sub(r'>$', ', false>', name)]
        got = next((new[c] for c in cand if c in new), None)
        same = got == body
        bad += not same
        print('%s %s' % ('IDENTICAL' if same else ('MISSING  ' if got is None else 'DIFFERENT'), name))
    print('%d of %d kernels differ from %s' % (bad, len(old), rev))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
