#!/usr/bin/env bash
# Builds the libFuzzer targets with clang under ASan/UBSan (in build-fuzz/)
# and fuzzes, each for a bounded time (default 40 s): the message path,
# seeded with the golden protocol files, and the other parsers a stranger
# reaches (HTTP heads and headers, preview hosts, the config file). Prints TAP. A crash is left in build-fuzz/crashes/
# to be turned into a golden file.
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-40}
if ! command -v clang >/dev/null; then
  echo "1..0 # SKIP clang is not installed"
  exit 77
fi
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized >build-fuzz.log 2>&1 || { echo "not ok 1 - configure the fuzz build"; cat build-fuzz.log | sed 's/^/# /'; exit 1; }
fi
if ! ninja -C build-fuzz tests/fuzz-mcp tests/fuzz-parsers >build-fuzz/ninja.log 2>&1; then
  echo "not ok 1 - build the fuzz targets"
  sed 's/^/# /' build-fuzz/ninja.log | tail -30
  exit 1
fi
echo "ok 1 - fuzz targets build with clang, ASan and UBSan"
corpus=build-fuzz/corpus
pcorpus=build-fuzz/corpus-parsers
mkdir -p "$corpus" "$pcorpus" build-fuzz/crashes
python3 - "$corpus" "$pcorpus" <<'PY'
import glob, json, os, sys
out, pout = sys.argv[1], sys.argv[2]
for i, path in enumerate(sorted(glob.glob('tests/golden/*.jsonl'))):
    lines = []
    for l in open(path):
        s = json.loads(l)
        if 'send' in s:
            lines.append(json.dumps(s['send']))
        elif 'sendRaw' in s:
            lines.append(s['sendRaw'])
    open(os.path.join(out, 'golden-%d' % i), 'w').write('\n'.join(lines) + '\n')
seeds = [
    b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8788\r\nAuthorization: Bearer abc\r\nContent-Length: 2\r\n\r\n{}',
    b'GET / HTTP/1.1\r\nHost: 3000-my-box-abcdefghijklmnop.localhost:8787\r\nUpgrade: websocket\r\n\r\n',
    b'3000-my-box-abcdefghijklmnop.localhost:8787',
    bytes.fromhex('abcd01000001000000000000026f6b04746573740000010001'),
    bytes.fromhex('abcd81800001000200000000026f6b04746573740000010001c00c0005000100000e10000603777777c00cc02a00010001000000'
                  '3c000464400102'),
    b'POST /u HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n',
    b'POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: keep-alive, Upgrade\r\nUpgrade: x\r\n\r\nhello',
    json.dumps({'maxSandboxes': 8, 'limits': {'memoryMB': 512, 'cpus': 1.5, 'pids': 100, 'diskMB': 1024},
                'http': '127.0.0.1:8788', 'mount': '/mnt/sbx', 'previewPort': 8787,
                'buckets': {'allowedEndpoints': ['http://127.0.0.1:'],
                            'profiles': {'r2': {'endpoint': 'https://x.example', 'region': 'auto',
                                                'accessKeyId': 'a', 'secretAccessKey': 's'}}}}).encode(),
]
for i, s in enumerate(seeds):
    open(os.path.join(pout, 'seed-%d' % i), 'wb').write(s)
PY
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1
rc=0
n=2
for t in mcp parsers; do
  c=$corpus
  [ $t = parsers ] && c=$pcorpus
  what="the message path"
  [ $t = parsers ] && what="HTTP heads, request framing, preview hosts, DNS messages and the config file"
  if build-fuzz/tests/fuzz-$t -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
       -artifact_prefix=build-fuzz/crashes/$t- "$c" >build-fuzz/fuzz-$t.log 2>&1; then
    runs=$(grep -ao 'Done [0-9]* runs' build-fuzz/fuzz-$t.log | grep -o '[0-9]*' | tail -1)
    echo "ok $n - fuzzed $what for ${secs} s (${runs:-?} runs) without a crash"
  else
    echo "not ok $n - the fuzzer found a crash in $what (see build-fuzz/crashes/)"
    grep -aE 'ERROR|SUMMARY|runtime error' build-fuzz/fuzz-$t.log | head -20 | sed 's/^/# /'
    rc=1
  fi
  n=$((n + 1))
done
echo "1..3"
exit $rc
