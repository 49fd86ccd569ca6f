#!/usr/bin/env bash
# Builds the libFuzzer target with clang under ASan/UBSan (in build-fuzz/)
# and fuzzes the message path for a bounded time (default 60 s), seeded with
# the golden protocol files. Prints TAP. A crash is left in build-fuzz/crashes/
# to be turned into a golden file.
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
if ! command -v clang >/dev/null; then
  echo "1..0 # SKIP clang is not installed"
  exit 77
fi
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized >build-fuzz.log 2>&1 || { echo "not ok 1 - configure the fuzz build"; cat build-fuzz.log | sed 's/^/# /'; exit 1; }
fi
if ! ninja -C build-fuzz tests/fuzz-mcp >build-fuzz/ninja.log 2>&1; then
  echo "not ok 1 - build the fuzz target"
  sed 's/^/# /' build-fuzz/ninja.log | tail -30
  exit 1
fi
echo "ok 1 - fuzz target builds with clang, ASan and UBSan"
corpus=build-fuzz/corpus
mkdir -p "$corpus" build-fuzz/crashes
python3 - "$corpus" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for i, path in enumerate(sorted(glob.glob('tests/golden/*.jsonl'))):
    lines = []
    for l in open(path):
        s = json.loads(l)
        if 'send' in s:
            lines.append(json.dumps(s['send']))
        elif 'sendRaw' in s:
            lines.append(s['sendRaw'])
    open(os.path.join(out, 'golden-%d' % i), 'w').write('\n'.join(lines) + '\n')
PY
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1
if build-fuzz/tests/fuzz-mcp -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
     -artifact_prefix=build-fuzz/crashes/ "$corpus" >build-fuzz/fuzz.log 2>&1; then
  runs=$(grep -ao 'Done [0-9]* runs' build-fuzz/fuzz.log | grep -o '[0-9]*' | tail -1)
  echo "ok 2 - fuzzed the message path for ${secs} s (${runs:-?} runs) without a crash"
  rc=0
else
  echo "not ok 2 - the fuzzer found a crash (see build-fuzz/crashes/)"
  grep -aE 'ERROR|SUMMARY|runtime error' build-fuzz/fuzz.log | head -20 | sed 's/^/# /'
  rc=1
fi
echo "1..2"
exit $rc
