#!/usr/bin/env bash
# Sets everything up and runs every test: the release build (warnings are errors), the
# same suite under AddressSanitizer + UndefinedBehaviorSanitizer, the engine's threaded tests
# under ThreadSanitizer, the NEON kernels
# cross-compiled for aarch64 and tested under qemu-user, and a short libFuzzer
# run over the checkpoint parsers, the tokenizer, the HTTP request parser and the JSON Schema
# compiler. CI (.ci/run) calls exactly this.
#   DSV4_FUZZ_SECONDS  seconds per fuzz target (default 30)
#   DSV4_SKIP_ASAN=1   skip the sanitizer build (local iteration only)
#   DSV4_SKIP_AARCH64=1  skip the aarch64 cross build and its qemu tests (local iteration only)
#   DSV4_SKIP_TSAN=1   skip the ThreadSanitizer build (local iteration only)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# ccache keys on paths relative to the checkout, so a fresh clone in another folder (CI's) hits
# what an earlier run on this machine compiled. The sanitizer builds keep line tables only
# (-g1: the reports' stack traces name functions and lines) to compile faster.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true

# Each stage's wall time, printed as a table at the end (also when a stage fails).
stage_names=() stage_secs=() stage_name="" stage_start=0
end_stage() {
  [[ -n "$stage_name" ]] || return 0
  stage_names+=("$stage_name")
  stage_secs+=($(( $(date +%s) - stage_start )))
  stage_name=""
}
step() {
  end_stage
  stage_name=$1 stage_start=$(date +%s)
  printf '\n== %s (%ds)\n' "$1" $(( stage_start - start ))
}
mmss() { printf '%d:%02d' $(( $1 / 60 )) $(( $1 % 60 )); }
stage_table() {
  local rc=$? failed=$stage_name
  end_stage
  printf '\n== stage times (%s, %d cores)\n' "$(uname -m)" "$(nproc)"
  printf '| %-50s | %7s |\n' stage time
  printf '|%s|%s|\n' "----------------------------------------------------" "---------"
  for i in "${!stage_names[@]}"; do
    printf '| %-50s | %7s |\n' "${stage_names[$i]}" "$(mmss "${stage_secs[$i]}")"
  done
  printf '| %-50s | %7s |\n' "total" "$(mmss $(( $(date +%s) - start )))"
  if (( rc != 0 )) && [[ -n "$failed" ]]; then printf 'failed in: %s (exit %d)\n' "$failed" "$rc"; fi
}
trap stage_table EXIT

step "setup"
scripts/setup.sh

jobs=$(nproc)

step "release build"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSV4_WERROR=ON >/dev/null
ninja -C build/release
step "release tests"
(cd build/release && ctest --output-on-failure -j "$jobs" --timeout 900)

# The GPU tier's kernels on Mesa's lavapipe (a Vulkan device on the CPU) with the validation
# layers on: they ran in the release tests already; here again on their own, and a skip (no
# Vulkan device found) fails the stage.
step "GPU tier on lavapipe (Vulkan validation on)"
build/release/dsv4_tests --gtest_filter='Gpu*' 2>&1 | tee build/gpu-tests.log | tail -n 3
if grep -q '\[  SKIPPED \]' build/gpu-tests.log || ! grep -q '\[  PASSED  \]' build/gpu-tests.log; then
  echo "the GPU tests did not all run and pass on lavapipe"; exit 1
fi

if [[ "${DSV4_SKIP_ASAN:-0}" != 1 ]]; then
  step "sanitizer build (ASan + UBSan)"
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDSV4_SANITIZE=ON -DDSV4_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" >/dev/null
  ninja -C build/asan
  step "sanitizer tests"
  # The tests that exercise memory, not every long one: left out here are reruns of code the
  # sanitizers already see in a shorter test (the scalar path's whole forward again, which the
  # kernel tests cover; the numerics against torch; the flashlike / demo copies of exactness
  # tests whose tiny-a copies run). The release stage runs them all.
  vulkan_tests='^(Gpu|GpuSelection|CliSettings)\.'
  asan_skip=(
    'SteadyState\.OnTheScalarPath'
    'demo_model_torch_vs_engine'
    'SpeculativeGeneration\.EveryModeEmitsTheTokensAndLogitsOfPlainDecoding/flashlike'
    'UndoLogTest\.RewindGivesTheSessionThatNeverSawThoseRows/"flashlike"'
    'ModelReference\.ChunkAndThreadInvariance/"flashlike"'
    'ConstrainedGeneration\.EveryFinishedOutputValidatesWithAnIndependentValidator/"flashlike"'
    'MtpTest\.EachDraftIsTheGreedyPickOfTheMtpLogitsAtThatPosition/"demo"'
  )
  (cd build/asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$jobs" --timeout 1800 -E "$(IFS='|'; echo "${asan_skip[*]}|${vulkan_tests}")")
  # The tests that load a Vulkan driver (the GPU kernels; `dsv4 settings`, which lists devices):
  # lavapipe leaks a few allocations from a module it unloads, which LeakSanitizer cannot
  # attribute or suppress. They run with every AddressSanitizer check but the leak check.
  (cd build/asan && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$jobs" --timeout 1800 -R "${vulkan_tests}")
fi

if [[ "${DSV4_SKIP_TSAN:-0}" != 1 ]]; then
  # ThreadSanitizer where threads meet in the engine: continuous batching (the batch queue, its
  # leading thread and members, a failed shared pass rerun per request) and the expert store's
  # read queues. Engine + runtime only and the tiny-a cases, to keep the stage short.
  step "thread sanitizer build (engine + runtime)"
  cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDSV4_TSAN=ON -DDSV4_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" >/dev/null
  ninja -C build/tsan dsv4_tests
  step "thread sanitizer tests"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build/tsan/dsv4_tests --gtest_brief=1 \
    --gtest_filter='Fixtures/BatchPass.EveryStreamAsAlone/0:Fixtures/BatchPass.EveryStreamAsAlone/1:Fixtures/BatchThreads.GenerationsAsAlone/0:Fixtures/BatchThreads.GenerationsAsAlone/1:Fixtures/BatchThreads.GenerationsAsAlone/2:Fixtures/BatchThreads.GenerationsAsAlone/3:Fixtures/BatchAdmission.*/0:BatchFaults.*:ExpertStore.*:ReadQueue.*:MoeArrivalOrder.*'
fi

if [[ "${DSV4_SKIP_AARCH64:-0}" != 1 ]]; then
  # The NEON kernels, cross-compiled with Debian's g++-aarch64-linux-gnu (only the engine and
  # its kernel and model tests) and run under qemu-user: every kernel test (bit-exact against
  # the scalar reference) and the tiny-a fixture against its Hugging Face reference.
  step "aarch64 cross build (engine + kernel/model tests)"
  cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSV4_WERROR=ON -DDSV4_ENGINE_ONLY=ON >/dev/null
  ninja -C build/aarch64
  step "aarch64 tests under qemu-user"
  qemu-aarch64 build/aarch64/dsv4_tests --gtest_brief=1 \
    --gtest_filter='Kernel*:PortableMath.*:Fixtures/ModelReference.TeacherForcedLogits/0:Fixtures/ModelReference.FastNumerics/0-KernelBench.*'
fi

if [[ "${DSV4_SKIP_WINDOWS:-0}" != 1 ]]; then
  # Windows: dsv4.exe and the Windows tests cross-compiled with Debian's MinGW-w64 (static, so
  # they run by themselves) and run under wine: kernels in every format and both numerics,
  # portable math's bits, the tokenizer, the fixtures' logits, streaming through the IOCP queue,
  # the corrupt-checkpoint refusals and the other tests that run dsv4.exe, the platform layer
  # (UTF-8 paths, a model folder in Cyrillic); then, from the Linux side, logits byte-identical
  # to the Linux binary's and dsv4.exe serve on loopback.
  step "windows cross build (MinGW-w64)"
  cmake -S . -B build/windows -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
    -DCMAKE_BUILD_TYPE=Release -DDSV4_WERROR=ON >/dev/null
  ninja -C build/windows dsv4 dsv4_tests
  step "windows tests under wine"
  export WINEPREFIX="$PWD/build/wine-prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
  # A fresh prefix is made and its services settle before the first test starts a process.
  wine wineboot --init
  wineserver --wait
  windows_skip=(
    'KernelBench.*'  # timings, not checks
    # Replacing or deleting a shard the engine holds open: Windows refuses the rename over an
    # open file and keeps a deleted one until it is closed, so the Linux scenario cannot happen.
    'ShardWatch.*'
    # A misaligned unbuffered read: Windows refuses it (the queue falls back to buffered), wine
    # performs it, so the fallback cannot be provoked here.
    'ReadQueue.FallsBackToBufferedWhenDirectIsRefused'
  )
  wine build/windows/dsv4_tests.exe --gtest_brief=1 \
    --gtest_filter="-$(IFS=:; echo "${windows_skip[*]}")"
  scripts/windows_checks.sh
fi

step "fuzz build (clang libFuzzer)"
CXX=clang++ CC=clang cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDSV4_FUZZ=ON \
  -DDSV4_SANITIZE=ON -DDSV4_TESTS=OFF -DDSV4_BENCH=OFF -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" >/dev/null
ninja -C build/fuzz parsers_fuzz tokenizer_fuzz http_fuzz schema_fuzz
step "fuzz run"
seconds=${DSV4_FUZZ_SECONDS:-30}
mkdir -p build/fuzz/corpus
cp -n fuzz/corpus/* build/fuzz/corpus/ 2>/dev/null || true
build/fuzz/parsers_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
  build/fuzz/corpus 2>&1 | tail -n 12
mkdir -p build/fuzz/corpus_tokenizer
cp -n fuzz/corpus_tokenizer/* build/fuzz/corpus_tokenizer/ 2>/dev/null || true
build/fuzz/tokenizer_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
  build/fuzz/corpus_tokenizer 2>&1 | tail -n 12
mkdir -p build/fuzz/corpus_http
cp -n fuzz/corpus_http/* build/fuzz/corpus_http/ 2>/dev/null || true
build/fuzz/http_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
  build/fuzz/corpus_http 2>&1 | tail -n 12
# The schema compiler: a slow input (a schema that does not compile in bounded time) fails too.
mkdir -p build/fuzz/corpus_schema
cp -n fuzz/corpus_schema/* build/fuzz/corpus_schema/ 2>/dev/null || true
build/fuzz/schema_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  build/fuzz/corpus_schema 2>&1 | tail -n 12

end_stage
printf '\n== all tests passed\n'
