#!/usr/bin/env bash
# The Windows build against the Linux one, from the Linux side (scripts/test.sh's Windows
# stage; run after both builds exist):
#  1. fixture logits from dsv4.exe under wine are byte-identical to the Linux binary's, in both
#     numerics, with every expert resident and with --ram min (streamed through the IOCP queue
#     and through the pread threads);
#  2. a corrupt checkpoint is refused by dsv4.exe with one line naming the file and exit 1;
#  3. dsv4.exe serve on loopback answers a chat completion and an SSE stream from curl here,
#     with the same text as the Linux server.
# Exits non-zero on the first difference.
set -euo pipefail
cd "$(dirname "$0")/.."
linux=build/release/dsv4
windows=build/windows/dsv4.exe
export WINEPREFIX=${WINEPREFIX:-$PWD/build/wine-prefix} WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
tmp=$(mktemp -d build/windows-checks.XXXXXX)
server_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
  wineserver -k 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# 1. Logits.
echo "0 5 17 3 99 42 7 250 13 1 2 64 31 8 400 77" >"$tmp/tokens.txt"
for fixture in tiny-a flashlike; do
  for numerics in reference fast; do
    args="score -m ../shared/fixtures/$fixture --numerics $numerics --tokens-file $tmp/tokens.txt --threads 2"
    $linux $args --logits-out "$tmp/linux.bin" 2>/dev/null
    for variant in "" "--ram min --io iocp" "--ram min --io threads"; do
      wine $windows $args $variant --logits-out "$tmp/windows.bin" 2>"$tmp/err" ||
        { cat "$tmp/err"; echo "windows checks: dsv4.exe $args $variant failed"; exit 1; }
      cmp -s "$tmp/linux.bin" "$tmp/windows.bin" ||
        { echo "windows checks: $fixture $numerics $variant: logits differ from the Linux build's"; exit 1; }
    done
    echo "windows checks: $fixture $numerics logits byte-identical (resident, --ram min iocp, --ram min threads)"
  done
done

# 2. A corrupt checkpoint: the header length of the first shard points past the end.
mkdir "$tmp/corrupt"
cp ../shared/fixtures/tiny-a/*.json "$tmp/corrupt/"
for shard in ../shared/fixtures/tiny-a/model-*.safetensors; do cp "$shard" "$tmp/corrupt/"; done
first=$(ls "$tmp"/corrupt/model-*.safetensors | head -n 1)
printf '\xff\xff\xff\xff\xff\x00\x00\x00' | dd of="$first" bs=1 count=8 conv=notrunc status=none
set +e
wine $windows inspect "$tmp/corrupt" >/dev/null 2>"$tmp/err"
code=$?
set -e
lines=$(grep -c . "$tmp/err" || true)
if [[ $code != 1 || $lines != 1 ]] || ! grep -q "$(basename "$first")" "$tmp/err"; then
  cat "$tmp/err"
  echo "windows checks: a corrupt shard must be refused with one line naming it and exit 1 (got exit $code, $lines lines)"
  exit 1
fi
echo "windows checks: corrupt checkpoint refused: $(cat "$tmp/err")"

# 3. serve on loopback, the demo model, greedy: the Windows server's answers equal the Linux one's.
port=$((20000 + RANDOM % 20000))
body='{"model":"dsv4","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":12,"temperature":0}'
stream_body='{"model":"dsv4","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":12,"temperature":0,"stream":true}'
ask() {  # ask URL BODY: the answer's text (non-streamed) or the concatenated deltas (streamed)
  curl -sS --max-time 120 -H 'Content-Type: application/json' -d "$2" "$1/v1/chat/completions"
}
text_of() { /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'; }
deltas_of() {
  /usr/bin/python3 -c '
import json, sys
out, done = [], False
for line in sys.stdin:
    line = line.strip()
    if line == "data: [DONE]": done = True
    elif line.startswith("data: "):
        for c in json.loads(line[6:])["choices"]: out.append(c["delta"].get("content") or "")
assert done, "no [DONE]"
print("".join(out))'
}
wait_ready() {
  for _ in $(seq 1 240); do
    curl -s --max-time 2 "$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "windows checks: the server at $1 did not come up"; return 1
}
$linux serve --port $port --threads 2 >/dev/null 2>"$tmp/linux-serve.err" &
server_pid=$!
wait_ready "http://127.0.0.1:$port"
want=$(ask "http://127.0.0.1:$port" "$body" | text_of)
kill $server_pid; wait $server_pid 2>/dev/null || true; server_pid=""

port=$((port + 1))
wine $windows serve --port $port --threads 2 >/dev/null 2>"$tmp/windows-serve.err" &
server_pid=$!
wait_ready "http://127.0.0.1:$port" || { cat "$tmp/windows-serve.err"; exit 1; }
got=$(ask "http://127.0.0.1:$port" "$body" | text_of)
streamed=$(ask "http://127.0.0.1:$port" "$stream_body" | deltas_of)
if [[ "$got" != "$want" || "$streamed" != "$want" ]]; then
  printf 'Linux:    %q\nWindows:  %q\nstreamed: %q\n' "$want" "$got" "$streamed"
  echo "windows checks: dsv4.exe serve answered differently from the Linux server"
  exit 1
fi
echo "windows checks: dsv4.exe serve answered a chat completion and an SSE stream as the Linux server does: $(printf '%q' "$got")"
