#!/usr/bin/env bash
# Set-up + build + all tests (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# A build with the CUDA backend defines MEGATRON_WITH_CUDA in every translation unit, so the
# '#else' side of the sources that test it (the CPU-only build of machines without nvcc) would not
# be compiled at all: compile those sources once more in a CPU-only configuration (objects only,
# a few minutes on 2 cores). A CPU-only build/ already covers them.
if [ -x build/bin/gpu_ops_test ]; then
  cmake -S . -B build-cpu-check -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRON_CUDA=OFF >/dev/null
  mapfile -t srcs < <(git ls-files 'megatron/*.cpp' 'tools/*.cpp' 'examples/*.cpp' '*.cpp' | grep -v '/cuda/' |
                      xargs grep -l 'MEGATRON_WITH_CUDA' | sort -u)
  mapfile -t objs < <(ninja -C build-cpu-check -t targets all | cut -d: -f1 | grep '\.cpp\.o$' |
                      grep -F -f <(printf '%s.o\n' "${srcs[@]}"))
  echo "CPU-only compile check: ${#objs[@]} sources that test MEGATRON_WITH_CUDA"
  [ "${#objs[@]}" -ge "${#srcs[@]}" ] || { echo "CPU-only compile check: found ${#objs[@]} objects for ${#srcs[@]} sources" >&2; exit 1; }
  ninja -C build-cpu-check -j "${JOBS:-$(nproc)}" "${objs[@]}" > build-cpu-check/objects.log 2>&1 ||
    { grep -B2 -A8 -m3 'error' build-cpu-check/objects.log >&2; echo "FAIL: the CPU-only build (-DMEGATRON_CUDA=OFF) does not compile" >&2; exit 1; }
fi
cd build
ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
