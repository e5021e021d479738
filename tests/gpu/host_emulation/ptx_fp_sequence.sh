#!/usr/bin/env bash
# Same-bits evidence without a GPU (needs nvcc, no GPU): compiles norm.cu and embedding_ce.cu to
# sm_90a PTX and compares the sequence of fp32 instructions (add/sub/mul/fma/div/rsqrt/max/ex2/
# lg2/setp .f32 and the shuffles, in program order) of each Session 11 kernel with the kernel it
# must reproduce bit for bit: the pipelined norm kernels at 4 chunks vs the register kernels (bf16
# rows, bf16 and fp32 gamma, LayerNorm and RMSNorm), the bulk-copy cross entropy vs the stash
# kernel (bf16, fp16). PASS per pair iff the sequences are identical. Not proof (ptxas schedules
# and may fuse the unrounded mul/add the same way only if it sees the same pattern, which it
# does here); the GPU checks are gpu_ops_test --only norms,ce_fused and tests/gpu/gpt2mem_check.sh.
# The pairs cover only NC = 4 (the register kernels' chunk count); for every NC, and for the
# register kernels themselves and the row-block backward (Session 12), it also checks that each
# bfloat16 dx of the norm backward
# (cvt.rn.bf16.f32) comes straight from an fma.rn.f32, dx = round(rstd * t + dres) with one fp32
# rounding: nvcc contracts `p * q + r` per instantiation, and before norm_bwd_row wrote the fma
# explicitly it computed element 0 at NC = 1 as mul.f32 then add.f32 (two roundings), so the
# h = 256 dx with the residual gradient differed from the register kernel's in the last bit (H200).
# The host emulation (norm_pipe_run.sh) runs g++'s code, which does not contract on x86-64, and
# cannot see that.
# A few minutes on 2 cores.
#   tests/gpu/host_emulation/ptx_fp_sequence.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/../../.."
W="${1:-$(mktemp -d /tmp/ptx_fp.XXXXXX)}"
mkdir -p "$W"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
for f in norm embedding_ce; do
  "$NVCC" -I"$ROOT" -DMEGATRON_WITH_CUDA=1 -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -std=c++17 -ptx \
    "$ROOT/megatron/core/ops/cuda/$f.cu" -o "$W/$f.ptx"
done
# body PTX NAME_PART: the kernel whose mangled name contains NAME_PART (up to the next .entry).
body() { awk -v n="$2" '/\.entry / {p = index($0, n) > 0} p' "$1"; }
fpseq() { grep -E "^\s+(@%p[0-9]+ )?(fma|mul|add|sub|div|rsqrt|sqrt|neg|max|min|ex2|rcp|lg2|setp)\.[a-z.]*f32|shfl" |
  awk '{print ($1 ~ /^@/ ? $2 : $1)}'; }
fails=0
pair() {  # pair PTX LABEL OLD NEW
  body "$1" "$3" | fpseq > "$W/a.seq"; body "$1" "$4" | fpseq > "$W/b.seq"
  local n; n=$(wc -l < "$W/a.seq")
  if [ "$n" -gt 0 ] && cmp -s "$W/a.seq" "$W/b.seq"; then echo "PASS $2: the same $n fp32 instructions in the same order"
  else echo "FAIL $2: $n vs $(wc -l < "$W/b.seq") fp32 instructions, sequences differ"; fails=$((fails + 1)); fi
}
B=13__nv_bfloat16
for ln in 1 0; do
  for g in S4_ f; do
    pair "$W/norm.ptx" "norm fwd ln=$ln gamma=$g pipe<4> vs reg" "19norm_fwd_reg_kernelILb${ln}E${B}${g}E" "20norm_fwd_pipe_kernelILb${ln}ELi4E${B}${g}E"
    pair "$W/norm.ptx" "norm bwd ln=$ln gamma=$g pipe<4> vs reg" "19norm_bwd_reg_kernelILb${ln}E${B}${g}E" "20norm_bwd_pipe_kernelILb${ln}ELi4E${B}${g}E"
  done
done
# dx_fma PTX: per norm_bwd_{reg,pipe,rowblk}_kernel, the defining instruction of every cvt.rn.bf16.f32
# source register must be fma.rn.f32 (fp32-row kernels store the fp32 value: no conversion, skipped).
dx_fma() {
  awk '
    /^\.entry / { name = ""; if ($2 ~ /norm_bwd_(pipe|reg|rowblk)_kernel/) { name = $2; sub(/\(.*/, "", name); n++ } delete def; next }
    name == "" { next }
    /^}/ { name = ""; next }
    {
      line = $0; gsub(/^[ \t{]+/, "", line); sub(/^@!?%p[0-9]+[ \t]+/, "", line)
      split(line, f, /[ \t,;]+/)
      if (f[1] == "cvt.rn.bf16.f32") {
        op = (f[3] in def) ? def[f[3]] : "?"
        cnt[name]++
        if (op != "fma.rn.f32") { bad[name]++; why[name] = why[name] " " op }
      } else if (f[2] ~ /^%f[0-9]+$/) def[f[2]] = f[1]
    }
    END {
      fails = 0
      for (k in cnt) {
        s = k; sub(/^.*norm_bwd_/, "norm_bwd_", s); sub(/EEvPK.*/, "", s)
        if (k in bad) { printf "FAIL %s: %d of %d dx values not from fma.rn.f32:%s\n", s, bad[k], cnt[k], why[k] | "sort"; fails++ }
        else printf "PASS %s: all %d dx values from fma.rn.f32\n", s, cnt[k] | "sort"
      }
      close("sort")
      if (n == 0) { print "FAIL no norm_bwd_*_kernel in the PTX"; fails++ }
      exit fails
    }' "$1"
}
dx_fma "$W/norm.ptx" || fails=$((fails + $?))
for t in "$B" 6__half; do
  pair "$W/embedding_ce.ptx" "ce_fused $t bulk vs stash" "15ce_fused_kernelI${t}Lb1ELb0E" "15ce_fused_kernelI${t}Lb0ELb1E"
done
echo "$fails failed"
[ "$fails" = 0 ]
