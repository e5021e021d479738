#!/bin/bash
# Compares the per-iteration "lm loss" of two pretrain_gpt logs (reference first, e.g. CPU fp32,
# then e.g. GPU bf16): prints the first and last loss of each, the largest relative difference
# over the iterations, and PASS when it is <= TOL (default 2e-2, the bf16 tolerance of
# docs/gpu-test-log.md: 8 mantissa bits = 3.9e-3 per rounding, compounded over 20 Adam steps).
# Fails on a missing iteration, a different iteration count, or NaN.
#   bench/gpu/compare_lm_loss.sh REF_LOG TEST_LOG [TOL]
set -u
tol=${3:-2e-2}
ext() { grep -oE "iteration +[0-9]+/.*lm loss: [^ ]+" "$1" | sed -E 's/iteration +([0-9]+)\/.*lm loss: ([^ ]+)/\1 \2/'; }
paste <(ext "$1") <(ext "$2") | awk -v tol="$tol" -v a="$1" -v b="$2" '
  { n++; if ($1 != $3) bad = 1; d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2);
    if ($4 != $4 + 0 || $4 ~ /nan|inf/) bad = 1; if (r > m) { m = r; at = $1 }
    if (n == 1) { f2 = $2; f4 = $4 } l2 = $2; l4 = $4 }
  END { if (n == 0) { print "FAIL no lm loss lines in " a " / " b; exit 1 }
        printf "%s %s vs %s: %d iterations, loss %s -> %s (ref) vs %s -> %s, max rel diff %.2e (iter %d), tol %s\n",
               (bad || m > tol) ? "FAIL" : "PASS", a, b, n, f2, l2, f4, l4, m, at, tol
        exit (bad || m > tol) ? 1 : 0 }'
