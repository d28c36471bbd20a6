#!/bin/bash
# The storage benchmarks of issue 19 for docs/benchmarks.md, in one quiet window (~10 min):
#   1. read rate with two source folders, each limited to RATE MB/s by the fault layer's rate
#      rule, against one: a recorded trace replayed (x0 compute = reads only), then live decode;
#   2. the hash-layer early reads, before/after, interleaved, on the real disk;
#   3. a short soak (decode speed, read rate and RSS over time).
# Usage: /work/bin/quiet scripts/bench_storage.sh CHECKPOINT MIRROR OUTDIR
# MIRROR: a folder of symlinks to CHECKPOINT's files (the rate rules tell the paths apart).
set -u
M=$1 MIR=$2 O=$3
B=${DSV4:-build/release/dsv4}
RATE=${RATE:-400}
RAM=${RAM:-4.8G}
mkdir -p "$O"
F1="rate:path=$M/:mbps=$RATE"
F2="rate:path=$MIR/:mbps=$RATE"
P="--ssd-probe-bytes 256M"
date -u; uptime
$B bench -m "$M" --ram $RAM $P --prompt-tokens 1 --gen-tokens 6 --trace-out "$O/trace.bin" > "$O/trace.txt" 2>&1
DSV4_TEST_IO_FAULTS="$F1" $B bench -m "$M" --ram $RAM $P --trace-in "$O/trace.bin" --json > "$O/replay-one.json" 2> "$O/replay-one.err"
DSV4_TEST_IO_FAULTS="$F1;$F2" $B bench -m "$M" --mirror "$MIR" --ram $RAM $P --trace-in "$O/trace.bin" --json > "$O/replay-two.json" 2> "$O/replay-two.err"
for r in 1 2; do
  DSV4_TEST_IO_FAULTS="$F1" $B bench -m "$M" --ram $RAM $P --prompt-tokens 1 --gen-tokens 8 > "$O/one-$r.txt" 2>&1
  DSV4_TEST_IO_FAULTS="$F1;$F2" $B bench -m "$M" --mirror "$MIR" --ram $RAM $P --prompt-tokens 1 --gen-tokens 8 > "$O/two-$r.txt" 2>&1
done
date -u; uptime
for r in 1 2 3; do
  $B bench -m "$M" --ram $RAM $P --prompt-tokens 16 --gen-tokens 16 --no-early-hash-reads > "$O/late-$r.txt" 2>&1
  $B bench -m "$M" --ram $RAM $P --prompt-tokens 16 --gen-tokens 16 > "$O/early-$r.txt" 2>&1
done
date -u; uptime
$B bench -m "$M" --ram $RAM $P --prompt-tokens 16 --gen-tokens 16 --soak 2 > "$O/soak.txt" 2>&1
date -u; uptime
