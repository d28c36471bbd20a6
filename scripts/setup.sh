#!/usr/bin/env bash
# Installs everything dsv4 needs on a Debian bookworm machine. Idempotent: packages
# already present are skipped, so a second run costs a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  # The Vulkan GPU tier (src/dsv4/gpu/): headers and loader, the shader compiler, and for its
  # tests Mesa's lavapipe (a Vulkan CPU device), the validation layer and vulkaninfo.
  libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libsimdjson-dev libboost1.74-dev libcpp-httplib-dev libcli11-dev libfmt-dev
  liburing-dev libpcre2-dev libxxhash-dev
  python3-numpy
  # The demo model's trainer and its engine-vs-torch test (tools/demo_model): Debian's torch,
  # OpenBLAS under it (the default reference BLAS is ~10x slower), the King James Bible it is
  # trained on, and the word list the demo test checks its English against.
  python3-torch libopenblas0-pthread bible-kjv bible-kjv-text wamerican
  # The independent JSON Schema validator of the constrained-decoding tests (tests/validate_json.py),
  # and RFC 3987 for its uri / uri-reference format checks.
  python3-jsonschema python3-rfc3987
)
# Node.js (for the tokenizer/OpenAI-SDK/browser test oracles): the machine's own if present.
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(nodejs npm)
WANT_BROWSER=${DSV4_SETUP_BROWSER:-1}
if [[ "$WANT_BROWSER" == 1 ]]; then APT_PACKAGES+=(chromium); fi

SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
# Installs those of the given packages that are missing; returns 1 when none was.
install_missing() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 1
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
install_missing "${APT_PACKAGES[@]}" || true

# The aarch64 stage of scripts/test.sh (the NEON kernels, cross-compiled and run under
# qemu-user): Debian's cross compiler, qemu-user and the arm64 multiarch packages the library
# links. libsimdjson-dev cannot be installed for two architectures at once, so the arm64 one is
# unpacked under build/arm64-deps (its CMake package; the toolchain file looks there).
# DSV4_SETUP_AARCH64=0 skips all of it.
if [[ "${DSV4_SETUP_AARCH64:-1}" == 1 ]]; then
  ARM64_PACKAGES=(g++-aarch64-linux-gnu qemu-user libfmt-dev:arm64 liburing-dev:arm64
    libgtest-dev:arm64 libgmock-dev:arm64 libsimdjson14:arm64)
  fresh=0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
    fresh=1
  fi
  if ! install_missing "${ARM64_PACKAGES[@]}" && ((fresh)); then
    $SUDO apt-get update -qq
  fi
  if [[ ! -f build/arm64-deps/.dsv4-unpacked ]]; then
    echo "setup: unpacking libsimdjson-dev:arm64 into build/arm64-deps"
    tmp=$(mktemp -d)
    chmod 777 "$tmp"  # apt-get download runs as _apt
    (cd "$tmp" && apt-get download -qq libsimdjson-dev:arm64 libsimdjson14:arm64 2>/dev/null)
    mkdir -p build/arm64-deps
    for deb in "$tmp"/*.deb; do dpkg -x "$deb" build/arm64-deps; done
    rm -rf "$tmp"
    touch build/arm64-deps/.dsv4-unpacked
  fi
fi

# The Windows stage of scripts/test.sh (dsv4.exe and the Windows tests, cross-compiled with
# Debian's MinGW-w64 and run under wine): the toolchain, wine, and the third-party code the
# Windows build needs, all from Debian: the header-only -dev packages (linked under
# build/win-deps/include, away from glibc's headers) and the source packages of PCRE2 and
# simdjson (apt-get source, from a deb-src entry this adds), which the cross build compiles.
# DSV4_SETUP_WINDOWS=0 skips all of it.
if [[ "${DSV4_SETUP_WINDOWS:-1}" == 1 ]]; then
  install_missing g++-mingw-w64-x86-64-posix wine wine64 dpkg-dev || true
  deps=build/win-deps
  if [[ ! -f $deps/.dsv4-ready ]]; then
    echo "setup: preparing the Windows dependencies in $deps"
    if ! apt-get source --print-uris pcre2 >/dev/null 2>&1; then
      $SUDO tee /etc/apt/sources.list.d/dsv4-deb-src.sources >/dev/null <<'SOURCES'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
      $SUDO apt-get update -qq
    fi
    rm -rf "$deps"
    mkdir -p "$deps/src" "$deps/include"
    tmp=$(mktemp -d)
    chmod 777 "$tmp"  # apt-get source downloads as _apt
    (cd "$tmp" && apt-get source --download-only -qq pcre2 simdjson >/dev/null 2>&1)
    for dsc in "$tmp"/pcre2_*.dsc "$tmp"/simdjson_*.dsc; do
      name=$(basename "$dsc"); name=${name%%_*}
      dpkg-source -q -x --no-check "$dsc" "$deps/src/$name" >/dev/null
    done
    rm -rf "$tmp" "$deps"/src/*.tar.*
    for h in nlohmann fmt boost CLI gtest gmock httplib.h xxhash.h; do ln -s "/usr/include/$h" "$deps/include/$h"; done
    touch "$deps/.dsv4-ready"
  fi
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
