#!/usr/bin/env python3
"""One-time import of the figures of the raw session logs that were under bench/results/ until
commit 3ba2c1c into the results file (docs/performance.md, "Results file"). Kept as the record of
which log, which iteration window and which parser gave each migrated row of bench/results.csv;
re-running it on the archived logs reproduces those rows byte for byte:

  git archive 3ba2c1c bench/results | tar x -C /tmp/old
  python3 bench/legacy_results_import.py /tmp/old /tmp/results.csv && cmp /tmp/results.csv bench/results.csv

(as long as no rows were appended to bench/results.csv since, and the build-VM tables of
docs/performance.md it transcribes are unchanged). Python 3 stdlib only.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import append_result as A  # noqa: E402
import check_perf_docs as CPD  # noqa: E402

if len(sys.argv) != 3:
    sys.exit("usage: legacy_results_import.py ARCHIVE_DIR OUT_CSV (ARCHIVE_DIR holds bench/results/ of 3ba2c1c)")
R = os.path.join(sys.argv[1], 'bench', 'results')
OUT = sys.argv[2]
DOC = os.path.join(os.path.dirname(HERE), 'docs', 'performance.md')
LAST = '3ba2c1c'   # last commit that has bench/results/
if os.path.exists(OUT): os.remove(OUT)
H1 = '1x H200 (nvidia-h200; driver 580.159.04)'
H1x2 = '1x H200 of nvidia-h200-x2 (driver 580.159.04)'
H2 = '2x H200 NV18 (nvidia-h200-x2; driver 580.159.04)'
VM = 'build VM (2-core AMD EPYC, shared)'
XEON = 'nvidia-h200-x2 host CPU (32-core Xeon)'
def emit(date, commit, machine, suite, command, rows, src, note=''):
    A.append(OUT, dict(date=date, commit=commit, machine=machine, suite=suite, command=command,
                       source=(f'{LAST}:bench/results/{src}' if src and not src.startswith('docs') else src), note=note), rows)
def bench(date, commit, machine, suite, cmd, log, peer=None, note=''):
    emit(date, commit, machine, suite, cmd, A.parse_bench_lines(f'{R}/{log}', f'{R}/{peer}' if peer else None), log, note)
    if peer:
        emit(date, commit, machine, suite, cmd.replace('kernels', 'kernels') + ' (peer: bench/gpu/torch_peers.py)',
             A.parse_bench_lines(f'{R}/{peer}'), peer, note)
def pre(date, commit, machine, suite, cmd, log, a, b, tok=None, name='', note=''):
    emit(date, commit, machine, suite, cmd, A.parse_pretrain(f'{R}/{log}', a, b, tok, name), log, note)
def kp(date, commit, machine, suite, cmd, log, name='', note=''):
    emit(date, commit, machine, suite, cmd, A.parse_kprof(f'{R}/{log}', name), log, note)
def smi(date, commit, machine, suite, cmd, log, name='', note=''):
    emit(date, commit, machine, suite, cmd, A.parse_smi_peak(f'{R}/{log}', name), log, note)
def val(date, commit, machine, suite, cmd, metric, v, unit, src, note='', peer='', pv=''):
    emit(date, commit, machine, suite, cmd, [(metric, v, unit, peer, pv)], src, note)
D29, D30 = '2026-11-29', '2026-11-30'
K = 'bench/gpu/run_bench.sh kernels BIN_DIR'
# ---- CUDA kernels, runs 1-5
bench(D29, '83d2530', H1, 'kernels', K, '2026-11-29-h200-cuda-run1/gpu_bench.log', '2026-11-29-h200-cuda-run1/torch_peers.log', 'run 1')
bench(D29, 'cfbf136', H1, 'kernels', K, '2026-11-29-h200-cuda-run2/gpu_bench.log', '2026-11-29-h200-cuda-run2/torch_peers.log', 'run 2')
bench(D29, '940658f', H1, 'kernels', K, '2026-11-29-h200-cuda-run3/gpu_bench.log', '2026-11-29-h200-cuda-run3/torch_peers.log', 'run 3')
bench(D29, '74c6dd8', H1x2, 'kernels', K, '2026-11-29-h200-gpuattn/run1_gpu_bench.log', '2026-11-29-h200-gpuattn/run1_torch_peers.log', 'run 4 (cuDNN graph; flash rows = MEGATRON_ATTENTION_BACKEND=flash)')
bench(D29, '3de5e63', H1x2, 'kernels-mem', 'bench/gpu/run_bench.sh kernels-mem BIN_DIR', '2026-11-29-h200-gpuattn/run2_gpu_bench_mem.log', None, 'run 5')
def P(date, commit, machine, suite, cmd, log, a, b, tok=None, name='', note=''):
    emit(date, commit, machine, suite, cmd, A.parse_pretrain(f'{R}/{log}', a, b, tok, name, True), log, note)
# ---- end-to-end on one H200
E = '2026-11-29-h200-e2e'
P(D29, '4ea95a3', H1, 'e2e', 'bench/gpu/run_bench.sh e2e BIN_DIR gpt2', f'{E}/gpt2_124m_mbs64.log', 11, 30, 65536, 'GPT-2 124M mbs 64 bf16')
P(D29, '8857184', H1, 'e2e', 'bench/gpu/run_bench.sh e2e BIN_DIR llama4l', f'{E}/llama8b_4l_seq8192_rerun.log', 6, 15, 8192, 'LLaMA-3-8B-shape 4 layers bf16 gbs 1')
val(D29, '8857184', H1, 'e2e', 'bench/gpu/run_bench.sh e2e BIN_DIR llama4l (peer: torch_llama_bench.py 4 8192 1 1)', 'PyTorch torch.compile LLaMA-3-8B-shape 4 layers ms/iter', 142.0, 'ms', f'{E}/torch_llama_bench.log', 'peer row', 'PyTorch 2.11 + torch.compile', 142.0)
val(D29, '8857184', H1, 'e2e', 'bench/gpu/run_bench.sh e2e BIN_DIR llama4l (peer)', 'PyTorch torch.compile LLaMA-3-8B-shape 4 layers tokens/s', 57694, 'tokens/s', f'{E}/torch_llama_bench.log', 'peer row', 'PyTorch 2.11 + torch.compile', 57694)
val(D29, '8857184', H1, 'e2e', 'bench/gpu/run_bench.sh e2e BIN_DIR llama4l (peer)', 'PyTorch torch.compile LLaMA-3-8B-shape 4 layers TFLOP/s', 530.3, 'TFLOP/s', f'{E}/torch_llama_bench.log', 'peer row', 'PyTorch 2.11 + torch.compile', 530.3)
# ---- FP8 on one H200
F = '2026-11-29-h200-fp8/call2'
P(D29, '73959bc', H1x2, 'fp8', 'bench/gpu/run_bench.sh fp8 BIN_DIR', f'{F}/llama8b_4l_bf16.log', 6, 15, 8192, 'LLaMA-3-8B-shape 4 layers bf16 gbs 1')
P(D29, '73959bc', H1x2, 'fp8', 'bench/gpu/run_bench.sh fp8 BIN_DIR', f'{F}/llama8b_4l_fp8.log', 6, 15, 8192, 'LLaMA-3-8B-shape 4 layers fp8 hybrid gbs 1')
emit(D29, '73959bc', H1x2, 'fp8', 'bench/gpu/run_bench.sh fp8 BIN_DIR', A.parse_fp8_gemm(f'{R}/{F}/fp8_gpu_test.log'), f'{F}/fp8_gpu_test.log', 'operands zero-filled')
# ---- DP2 on two H200
L = '2026-11-29-h200x2-dist/ll'
for f, n in [('ll_1gpu', 'one GPU gbs 1'), ('ll_dp2', 'DP2 gbs 2'), ('ll_dp2_distopt', 'DP2 + distributed optimizer'), ('ll_dp2_bf16grad', 'DP2 + distributed optimizer + grad-reduce-in-bf16')]:
    P(D29, '00cab29', H2, 'dist', 'bench/gpu/run_bench.sh dist BIN_DIR', f'{L}/{f}.log', 16, 20, 8192, f'LLaMA-3-8B-shape 4 layers bf16 {n}', 'tokens/s per GPU')
# ---- LLaMA-3 8B, issue 12 (fe01645)
C3, C4 = '2026-11-29-h200x2-8b/call3-8b', '2026-11-29-h200x2-8b/call4-g128'
L8 = 'bench/gpu/run_bench.sh llama8b BIN_DIR'
for log, a, b, g, n in [(f'{C4}/bf16_g128', 2, 2, 128, 'bf16 DP2 dist-opt gbs 128'), (f'{C3}/bf16_dp2_g32', 2, 5, 32, 'bf16 DP2 dist-opt gbs 32'),
                        (f'{C3}/straight4', 2, 4, 8, 'bf16 DP2 dist-opt gbs 8'), (f'{C3}/bf16_tp2', 2, 4, 8, 'bf16 TP2+SP gbs 8'),
                        (f'{C4}/fp8_g128', 2, 2, 128, 'fp8 DP2 dist-opt gbs 128'), (f'{C3}/fp8_dp2_g32', 2, 5, 32, 'fp8 DP2 dist-opt gbs 32')]:
    P(D30, 'fe01645', H2, 'llama8b', L8, log + '.log', a, b, g * 8192 / 2, 'LLaMA-3 8B ' + n, 'tokens/s per GPU')
P(D30, 'fe01645', H2, 'llama8b', L8 + ' (BENCH_CKPT=1 EXTRA_ARGS=--exit-interval 2)', f'{C3}/ckpt_save.log', 2, 2, 8 * 8192 / 2, 'LLaMA-3 8B bf16 DP2 gbs 8 save run', 'tokens/s per GPU')
for n, v in [('bf16 DP2 gbs 128', 117484), ('fp8 DP2 gbs 128', 132524)]:
    val(D30, 'fe01645', H2, 'llama8b', L8 + ' (BENCH_GBS=128)', f'LLaMA-3 8B {n} nvidia-smi peak memory.used', v, 'MiB', 'docs/performance.md', 'log not kept (call 4 kept no nvidia-smi samples); transcribed from docs/performance.md')
for log, n in [(f'{C3}/bf16_dp2_g32', 'bf16 DP2 gbs 32'), (f'{C3}/bf16_tp2', 'bf16 TP2+SP gbs 8'), (f'{C3}/fp8_dp2_g32', 'fp8 DP2 gbs 32'), (f'{C3}/ckpt_save', 'bf16 DP2 gbs 8 save'), (f'{C3}/eval_1gpu', 'eval 1 GPU')]:
    smi(D30, 'fe01645', H2, 'llama8b', L8, log + '.mem.csv.gz', 'LLaMA-3 8B ' + n)
kp(D30, 'fe01645', H2, 'llama8b', L8, f'{C3}/bf16_dp2_g32.log', 'LLaMA-3 8B bf16 DP2 gbs 32')
kp(D30, 'fe01645', H2, 'llama8b', L8, f'{C3}/fp8_dp2_g32.log', 'LLaMA-3 8B fp8 DP2 gbs 32')
# ---- LLaMA-3 8B first measurement (d2655b1)
C1 = '2026-11-29-h200x2-8b/call1'
for f, a, b, n in [('bf16_dp2', 4, 6, 'bf16 DP2 dist-opt mock'), ('bf16_dp2_real', 3, 5, 'bf16 DP2 dist-opt real data'), ('fp8_dp2', 4, 6, 'fp8 DP2 dist-opt mock')]:
    P(D29, 'd2655b1', H2, 'llama8b', L8 + ' (BENCH_GBS=8)', f'{C1}/{f}.log', a, b, 8 * 8192 / 2, 'LLaMA-3 8B gbs 8 ' + n, 'tokens/s per GPU')
for f in ['bf16_dp2', 'bf16_dp2_real', 'fp8_dp2', 'bf16_tp2', 'fp8_tp2']:
    smi(D29, 'd2655b1', H2, 'llama8b', L8 + ' (BENCH_GBS=8)', f'{C1}/{f}.mem.csv.gz', 'LLaMA-3 8B gbs 8 ' + f)
# ---- gpuattn e2e (74c6dd8, 3de5e63)
G = '2026-11-29-h200-gpuattn'
for f, c, n, tok, a in [('run1_llama_flash', '74c6dd8', 'LLaMA-3-8B-shape 4L flash', 8192, 2), ('run1_llama_cudnn', '74c6dd8', 'LLaMA-3-8B-shape 4L cuDNN', 8192, 2),
                        ('run2_llama_cudnn', '3de5e63', 'LLaMA-3-8B-shape 4L cuDNN + profile fixes', 8192, 2),
                        ('run1_gpt2_flash', '74c6dd8', 'GPT-2 124M flash', 65536, 2), ('run1_gpt2_cudnn', '74c6dd8', 'GPT-2 124M cuDNN', 65536, 2),
                        ('run2_gpt2_cudnn', '3de5e63', 'GPT-2 124M cuDNN + profile fixes', 65536, 2)]:
    P(D29, c, H1x2, 'e2e', 'bench/gpu/run_bench.sh e2e BIN_DIR', f'{G}/{f}.log', 5 if tok == 8192 else 6, 10**6, tok, n, 'mean of the logged intervals after the first two')
for f, c in [('profile_llama_before_fixes', '74c6dd8'), ('profile_llama_after_fixes', '3de5e63'), ('profile_gpt2_after_fixes', '3de5e63')]:
    emit(D29, c, H1x2, 'ncu-profile', 'bench/gpu/run_bench.sh ncu-profile BIN_DIR', A.parse_ncu_profile(f'{R}/{G}/{f}.txt', f.replace('profile_', '')), f'{G}/{f}.txt', 'ncu gpu__time_duration of the third iteration')
    for ln in open(f'{R}/{G}/{f}.txt'):
        m = re.match(r'kernels in step: (\d+), kernel time ([0-9.]+) ms, step ([0-9.]+) ms', ln)
        if m:
            val(D29, c, H1x2, 'ncu-profile', 'bench/gpu/run_bench.sh ncu-profile BIN_DIR', f.replace('profile_', '') + ' measured step', float(m.group(3)), 'ms', f'{G}/{f}.txt')
# ---- hostgap / fp8perf / ckptio checks (fe01645)
CK = '2026-11-29-h200x2-8b/call2-checks'
for chk in ['hostgap', 'fp8perf', 'ckptio', 'tp2mem', 'kprof']:
    try:
        emit(D30, 'fe01645', H1x2 if chk != 'ckptio' else 'nvidia-h200-x2 host disk (ext4 on virtio)', 'check', f'bench/gpu/run_bench.sh check BIN_DIR {chk}', A.parse_info(f'{R}/{CK}/{chk}.log'), f'{CK}/{chk}.log')
    except A.LogError as e: print('skip', e)
H0 = f'{CK}/a0/hostgap'
P(D30, 'fe01645', H1x2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR hostgap', f'{H0}/gpt2_ep1.log', 2, 10**6, 65536, 'GPT-2 124M epilogues on')
P(D30, 'fe01645', H1x2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR hostgap', f'{H0}/gpt2_ep0.log', 2, 10**6, 65536, 'GPT-2 124M MEGATRON_GEMM_EPILOGUES=0')
P(D30, 'fe01645', H1x2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR hostgap', f'{H0}/llama8b_4l.log', 2, 10**6, 8192, 'LLaMA-3-8B-shape 4L')
for f, n in [('gpt2_ep1', 'GPT-2 epilogues on'), ('gpt2_ep0', 'GPT-2 epilogues off'), ('llama8b_4l', 'LLaMA 4L')]:
    try: kp(D30, 'fe01645', H1x2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR hostgap', f'{H0}/{f}.log', n)
    except A.LogError as e: print('skip', e)
# ---- session 4 call A/B (f922713, 6e807fe)
S4 = '2026-11-30-h200-s4'
LLC = 'bench/gpu/run_bench.sh ll4 BIN_DIR'
for f, tok, n in [('ll_bf16_g1', 8192, 'bf16 gbs 1'), ('ll_fp8_g1', 8192, 'fp8 gbs 1'), ('ll_bf16_g4', 32768, 'bf16 gbs 4'), ('ll_fp8_g4', 32768, 'fp8 gbs 4')]:
    P(D30, 'f922713', H1x2, 'll4', LLC, f'{S4}/callA/{f}.log', 2, 10**6, tok, 'LLaMA-3-8B-shape 4L ' + n)
    if 'g1' in f: kp(D30, 'f922713', H1x2, 'll4', LLC + ' (MEGATRON_KERNEL_PROFILE=5:6)', f'{S4}/callA/{f}.log', 'LLaMA-3-8B-shape 4L ' + n)
P(D30, 'f922713', H1x2, 'gpt2', 'bench/gpu/run_bench.sh gpt2 BIN_DIR', f'{S4}/callA/gpt2.log', 2, 10**6, 65536, 'GPT-2 124M mbs 64')
kp(D30, 'f922713', H1x2, 'gpt2', 'bench/gpu/run_bench.sh gpt2 BIN_DIR (MEGATRON_KERNEL_PROFILE=10:11)', f'{S4}/callA/gpt2.log', 'GPT-2 124M mbs 64')
for f, tok in [('gpt2_at0', 65536), ('gpt2_at1', 65536), ('gpt2_noep_at0', 65536), ('gpt2_noep_at1', 65536), ('gpt2_noep_prof', 65536), ('ll_bf16_at0', 8192), ('ll_bf16_at1', 8192), ('ll_fp8_at0', 8192), ('ll_fp8_at1', 8192)]:
    P(D30, '6e807fe', H1x2, 'll4' if f.startswith('ll') else 'gpt2', (LLC if f.startswith('ll') else 'bench/gpu/run_bench.sh gpt2 BIN_DIR') + (' (MEGATRON_GEMM_AUTOTUNE=%s)' % f[-1] if 'at' in f else ''), f'{S4}/callB/{f}.log', 4, 10**6, tok, f, 'iterations 4-12; autotuner build')
    P(D30, '6e807fe', H1x2, 'll4' if f.startswith('ll') else 'gpt2', 'same', f'{S4}/callB/{f}.log', 4, 10, tok, f, 'iterations 4-10')
kp(D30, '6e807fe', H1x2, 'gpt2', 'bench/gpu/run_bench.sh gpt2 BIN_DIR (MEGATRON_GEMM_EPILOGUES=0 MEGATRON_KERNEL_PROFILE=10:11)', f'{S4}/callB/gpt2_noep_prof.log', 'GPT-2 124M no epilogues')
# ---- session 4 call C/E checks, session 5 call 1
for c, commit, call, chk, log in [('C', '1d822ef', 'callC', 'gpt2perf', 'gpt2perf.log'), ('C', '1d822ef', 'callC', 'fp8fuse', 'fp8fuse.log'),
                                  ('C', '1d822ef', 'callC', 'fp8pg', 'fp8pg.log'), ('E', '99ef0b3', 'callE', 'fp8pg', 'fp8pg.log')]:
    emit(D30, commit, H2 if chk == 'fp8pg' else H1x2, 'check', f'bench/gpu/run_bench.sh check BIN_DIR {chk}', A.parse_info(f'{R}/{S4}/{call}/{log}'), f'{S4}/{call}/{log}')
P(D30, '99ef0b3', H2, 'llama8b', L8 + ' (DTYPE=fp8 BENCH_GBS=32 BENCH_ITERS=4)', f'{S4}/callE/fp8_g32.log', 2, 4, 32 * 8192 / 2, 'LLaMA-3 8B fp8 DP2 gbs 32 (fp8-param-gather)', 'tokens/s per GPU')
for f in ['gpt2_fused', 'gpt2_unfused', 'gpt2_CE_FUSED_STASH', 'gpt2_REDUCE_MULTI']:
    P(D30, 'd7f60d2', H1x2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR cefuse', f'2026-11-30-h200-s5/call1/cefuse/{f}.log', 3, 16, 65536, 'GPT-2 124M ' + f)
emit(D30, 'fe01645', 'nvidia-h200-x2 host disk (ext4 on virtio)', 'check', 'bench/gpu/run_bench.sh check BIN_DIR ckptio', A.parse_ckpt(f'{R}/{CK}/ckptio.log'), f'{CK}/ckptio.log')
# ---- context parallel (c872b59)
CP = '2026-11-29-h200x2-cp-ckpt'
for s in (16384, 32768):
    for cp in (1, 2):
        P(D29, 'c872b59', H2 if cp == 2 else H1x2, 'cp', 'bench/gpu/run_bench.sh cp BIN_DIR', f'{CP}/ll_s{s}_cp{cp}.log', 2, 8, s, f'LLaMA-3-8B-shape 4L seq {s} CP{cp}', 'tokens/s = all GPUs')
        if cp == 2:
            P(D29, 'c872b59', H2, 'cp', 'bench/gpu/run_bench.sh cp BIN_DIR', f'{CP}/ll_s{s}_cp{cp}.log', 2, 8, s / 2, f'LLaMA-3-8B-shape 4L seq {s} CP{cp} per GPU', 'tokens/s per GPU')
for ln in open(f'{R}/{CP}/peak_memory_nvidia_smi.txt'):
    name, rest = ln.split(':', 1)
    for g, v in re.findall(r'gpu(\d)=(\d+)MiB', rest):
        val(D29, 'c872b59', H2, 'cp', 'bench/gpu/run_bench.sh cp BIN_DIR', f'{name} nvidia-smi peak memory.used gpu{g}', float(v), 'MiB', f'{CP}/peak_memory_nvidia_smi.txt')
# ---- preprocess on the 32-core host (55e68f2)
emit(D29, '55e68f2', XEON, 'preprocess', 'bench/gpu/run_bench.sh preprocess BIN_DIR', A.parse_preprocess(f'{R}/2026-11-29-h200x2-preprocess/bench.log'), '2026-11-29-h200x2-preprocess/bench.log', 'peer: Megatron-LM tools/preprocess_data.py d98e8a6 in the same call')
# ---- ckptio on the build VM (42e6bce after / d2655b1 before, same call)
CI = '2026-11-29-ckptio'
for f in ['run1_interleaved.txt', 'run2_interleaved_final.txt', 'run3_load_ab.txt', 'tune.txt', 'dd_before.txt', 'ours_before_d2655b1.txt', 'device_script_on_build_vm/summary.txt', 'device_script_on_build_vm/checkpoint_bench.log']:
    try:
        emit(D29, '42e6bce', VM, 'ckptio', 'bench/checkpoint/device_ckpt_bench.sh BIN_DIR (checkpoint_bench bench --size-mb 2048 --repeat 2)', A.parse_ckpt(f'{R}/{CI}/{f}'), f'{CI}/{f}', 'sections "before" = main d2655b1 in the same call')
    except A.LogError as e: print('skip', e)
emit(D30, 'f922713', H1x2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR recompute', A.parse_info(f'{R}/{S4}/callA/recompute.log'), f'{S4}/callA/recompute.log')
for f, n in [('tp1', 'TP1'), ('tp2_sp', 'TP2+SP')]:
    P(D30, 'fe01645', H2, 'check', 'bench/gpu/run_bench.sh check BIN_DIR tp2mem', f'{CK}/tp/tp2mem/{f}.log', 1, 10**6, None, 'LLaMA-3-8B-shape 4L ' + n)
for m, v, u in [('fwd time', 2.43, 'ms'), ('fwd rate', 226, 'TFLOP/s'), ('bwd time', 8.25, 'ms'), ('bwd rate', 167, 'TFLOP/s'), ('fwd+bwd time', 10.68, 'ms'), ('fwd+bwd rate', 180, 'TFLOP/s')]:
    val(D29, '440fc1b', H1, 'kernels', K, f'attention llama3-8b s=8192 default variant {m}', v, u, 'docs/gpu-test-log.md', 'log not kept (run 4 kept no gpu_bench.log); transcribed from docs/gpu-test-log.md')
for m, v, u in [('fwd time', 0.620, 'ms'), ('fwd rate', 166, 'TFLOP/s'), ('bwd time', 2.17, 'ms'), ('bwd rate', 119, 'TFLOP/s'), ('fwd+bwd time', 2.79, 'ms'), ('fwd+bwd rate', 129, 'TFLOP/s')]:
    val(D29, '440fc1b', H1, 'kernels', K, f'attention gpt2-124m s=1024 b=64 default variant {m}', v, u, 'docs/gpu-test-log.md', 'log not kept (run 4 kept no gpu_bench.log); transcribed from docs/gpu-test-log.md')
# ---- figures whose raw log was never committed (build VM): transcribed from the doc, which states date and commit
doc = open(DOC, encoding='utf-8').read().splitlines()
def transcribe(header_prefix, commit, suite, cmd, cols):
    i = next(k for k, l in enumerate(doc) if l.startswith(header_prefix))
    hdr = CPD.split_row(doc[i]); rows = []
    j = i + 2
    while j < len(doc) and doc[j].startswith('|'):
        cells = CPD.split_row(doc[j])
        for ci, cell in enumerate(cells, start=1):
            if ci in cols:
                for k, (tok, v, tol) in enumerate(CPD.cell_numbers(cell)):
                    rows.append((f"{cells[0].replace('**','')[:90]} | {hdr[ci-1]} [#{k+1}]", v, '', '', ''))
        j += 1
    emit(D29, commit, VM, suite, cmd, rows, 'docs/performance.md', 'log not kept; transcribed from docs/performance.md (date and commit stated there)')
transcribe('| run | wall | MiB/s (wall)', '5f6006a', 'preprocess-vm', 'bench/preprocess/run_bench.sh', range(2, 7))
transcribe('| run | tokens/s (wall) | CPU s', '21fe8d0', 'cpu-training', 'bench/training/run_bench.sh 1', range(2, 4))
transcribe('| what | figure |', '553c913', 'ckpt-vm', 'checkpoint_bench bench --dir /tmp/ckpt_bench_run --size-mb 1024 --repeat 2', range(2, 3))
transcribe('| mode | blocked per save', '52f96f4', 'ckpt-cost', 'bench/checkpoint/pretrain_gpt_save_cost.sh build/bin /tmp/ck2/bench 2', range(2, 5))
transcribe('| | megatron.cpp CPU s', '8718943', 'datasets', 'build/bin/dataset_index_bench --tokens 1000000000; bench/datasets/megatron_index_bench.py', range(2, 4))
transcribe('| tokenizer | ours, MB/s per core', 'c44ca60', 'tokenizers', 'build/bin/tokenizer_bench; bench/tokenizers/hf_reference_bench.mjs', range(2, 5))
# ---- commit fix-ups: rows of a call that measured two binaries
import csv
rows = list(csv.DictReader(open(OUT)))
for r in rows:
    if r['suite'] == 'ckptio' and r['metric'].startswith('before'):
        r['commit'] = 'd2655b1'
    if r['source'].endswith('device_script_on_build_vm/summary.txt') or 'device_script_on_build_vm/checkpoint_bench' in r['source']:
        r['commit'] = '963f645'
with open(OUT, 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=A.COLUMNS, lineterminator='\n'); w.writeheader(); w.writerows(rows)
