#!/usr/bin/env bash
# MoE kernels and layer benchmark on one H200 (docs/moe.md "Performance"; issue 22):
#   bench/gpu/moe_bench.sh BIN_DIR
# = bench/gpu/run_bench.sh moe BIN_DIR: gpu_bench moe (Mixtral-8x7B- and Qwen3-30B-A3B-shaped expert
# GEMMs through the grouped op with MEGATRON_MOE_GROUPED_GEMM=1 (grouped cuBLAS), =0 (per-expert
# loop) and auto (the per-call rule training uses), each followed by a "... paths:" line naming the
# path of each GEMM kind, beside one dense GEMM set of the same FLOPs; three more shapes between
# them; then the MoE layer's forward + backward and the router + permute + unpermute + aux-loss
# share), the PyTorch peer bench/gpu/moe_peers.py (torch._grouped_mm / per-expert loop) and a
# Mixtral-shaped pretrain_gpt (2 layers, seq 4096; MOE_PRETRAIN=0 skips it). Rows go to
# $OUT/results.csv (append to bench/results.csv as run_bench.sh says). About 4 minutes.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../../tests/gpu/cuda_libs.sh"
exec "$HERE/run_bench.sh" moe "${1:?usage: moe_bench.sh BIN_DIR}"
