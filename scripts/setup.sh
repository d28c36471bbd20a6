#!/usr/bin/env bash
# Installs everything dsv4 needs on a Debian bookworm machine. Idempotent: packages
# already present are skipped, so a second run costs a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libsimdjson-dev libboost1.74-dev libcpp-httplib-dev libcli11-dev libfmt-dev
  liburing-dev libpcre2-dev
  python3-numpy
  # The demo model's trainer and its engine-vs-torch test (tools/demo_model): Debian's torch,
  # OpenBLAS under it (the default reference BLAS is ~10x slower), the King James Bible it is
  # trained on, and the word list the demo test checks its English against.
  python3-torch libopenblas0-pthread bible-kjv bible-kjv-text wamerican
)
# Node.js (for the tokenizer/OpenAI-SDK/browser test oracles): the machine's own if present.
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(nodejs npm)
WANT_BROWSER=${DSV4_SETUP_BROWSER:-1}
if [[ "$WANT_BROWSER" == 1 ]]; then APT_PACKAGES+=(chromium); fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages for the test oracles (pinned in tests/node/package.json).
if [[ -f tests/node/package.json ]]; then
  if [[ ! -f tests/node/node_modules/.dsv4-installed ]] ||
     [[ tests/node/package.json -nt tests/node/node_modules/.dsv4-installed ]]; then
    echo "setup: installing npm packages for tests"
    (cd tests/node && npm install --no-audit --no-fund --loglevel=error >/dev/null)
    touch tests/node/node_modules/.dsv4-installed
  fi
fi
echo "setup: ok"
