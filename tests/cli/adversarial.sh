#!/usr/bin/env bash
# Adversarial CLI suite, no GPU needed (ctest's cli_adversarial):
#   tests/cli/adversarial.sh FUSEBOX_BIN SOURCE_DIR
# Every bad input is generated here (sparse files, FIFOs, links, hostile
# bytes), never stored. Each case asserts the exit code, the error class on
# stderr ("fusebox CMD: Class: ..."), a message pattern, and bounds on peak
# RSS and wall time, so a reader that blocks or slurps shows up as a failure.
# Ends with "N passed, M failed" and exits 1 if M > 0.
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 FUSEBOX_BIN SOURCE_DIR" >&2
  exit 2
fi
FB=$1
SRC=$2
DEVPROP="$SRC/devices/h200-cudnn-9.27.devprop"
GRAPH="$SRC/examples/graphs/small/conv_bias_relu_small.json"
TIME_BIN=/usr/bin/time
# Bounds per command: a refused input costs what the process costs at start-up
# (about 40 MB here), not what the input claims; commands that run cuDNN's
# heuristics (build, engines, tune) map its engine libraries (about 340 MB here).
# MAX_SECS kills a command that blocks; SLOW_SECS fails one that is merely slow.
MAX_RSS_KB=${FUSEBOX_ADVERSARIAL_MAX_RSS_KB:-150000}
BUILD_RSS_KB=${FUSEBOX_ADVERSARIAL_BUILD_RSS_KB:-800000}
MAX_SECS=${FUSEBOX_ADVERSARIAL_MAX_SECS:-20}
SLOW_SECS=${FUSEBOX_ADVERSARIAL_SLOW_SECS:-10}
if [ ! -x "$FB" ] || [ ! -x "$TIME_BIN" ]; then
  echo "adversarial: need $FB and $TIME_BIN (GNU time; scripts/setup.sh installs it)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/fusebox_adv.XXXXXX")
trap 'chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
export FUSEBOX_CACHE="$TMP/default-cache.sqlite"
PASS=0
FAIL=0
RC=0
RSS_KB=0
SECS=0

pass() { PASS=$((PASS + 1)); echo "PASS  $1  (exit $RC, ${RSS_KB} KiB, ${SECS} s)"; }
fail() {
  FAIL=$((FAIL + 1))
  echo "FAIL  $1: $2"
  echo "      command: fusebox ${CMD[*]}"
  sed -n '1,4s/^/      stderr| /p' "$TMP/stderr" | cat -v
  sed -n '1,4s/^/      stdout| /p' "$TMP/stdout" | cat -v
}

# run_fb ARGS...: runs fusebox under GNU time and a timeout; sets RC, RSS_KB,
# SECS, CMD, $TMP/stdout, $TMP/stderr. Stdin is $STDIN_FILE or /dev/null.
run_fb() {
  CMD=("$@")
  local t0 t1
  t0=$(date +%s%N)
  "$TIME_BIN" -f %M -o "$TMP/rss" timeout "$MAX_SECS" "$FB" "$@" >"$TMP/stdout" 2>"$TMP/stderr" \
    <"${STDIN_FILE:-/dev/null}"
  RC=$?
  t1=$(date +%s%N)
  SECS=$(((t1 - t0) / 1000000000))
  RSS_KB=$(tail -n 1 "$TMP/rss" 2>/dev/null | tr -cd '0-9')
  RSS_KB=${RSS_KB:-0}
}

# Why the last command failed its bounds or crashed; nothing if it did not.
bounds_or_crash() {
  local rss_limit=$MAX_RSS_KB
  case "${CMD[0]:-}" in build|engines|tune) rss_limit=$BUILD_RSS_KB ;; esac
  if [ "$RC" -eq 124 ]; then echo "timed out (${MAX_SECS} s): it blocked or ran away"
  elif [ "$RC" -ge 128 ]; then echo "killed by signal $((RC - 128))"
  elif grep -qE "terminate called|Segmentation fault|Aborted|AddressSanitizer|runtime error:|internal error" \
      "$TMP/stdout" "$TMP/stderr"; then echo "crash or internal error in the output"
  elif [ "$RSS_KB" -gt "$rss_limit" ]; then echo "peak RSS ${RSS_KB} KiB > ${rss_limit} KiB"
  elif [ "$RSS_KB" -eq 0 ]; then echo "no RSS measured (GNU time output missing)"
  elif [ "$SECS" -gt "$SLOW_SECS" ]; then echo "took ${SECS} s > ${SLOW_SECS} s"
  fi
}

# expect NAME RC CLASS PATTERN ARGS...: exit RC, stderr names CLASS (e.g.
# IoError; "" for none) and matches PATTERN (extended regex, case-insensitive).
expect() {
  local name=$1 want_rc=$2 class=$3 pattern=$4
  shift 4
  run_fb "$@"
  local why
  why=$(bounds_or_crash)
  if [ -n "$why" ]; then fail "$name" "$why"; return 1; fi
  if [ "$RC" -ne "$want_rc" ]; then fail "$name" "exit $RC, expected $want_rc"; return 1; fi
  if [ -n "$class" ] && ! grep -qE "^fusebox [a-z]+: $class: " "$TMP/stderr"; then
    fail "$name" "stderr does not report $class"; return 1
  fi
  if ! grep -qiE -- "$pattern" "$TMP/stderr" "$TMP/stdout"; then
    fail "$name" "the output does not match /$pattern/"; return 1
  fi
  pass "$name"
}

# check NAME CONDITION-COMMAND...: records a pass or a failure of an extra assertion.
check() {
  local name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name" "assertion failed: $*"; fi
}

no_control_bytes() { ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$@"; }
valid_json() { python3 -c 'import json,sys; json.load(open(sys.argv[1], encoding="utf-8"))' "$1" 2>/dev/null; }
json_field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1], encoding="utf-8")); print(eval(sys.argv[2]))' "$1" "$2"; }

# ---------------------------------------------------------------- special files as inputs
mkfifo "$TMP/fifo.json"
mkdir "$TMP/dir.json"
truncate -s 65M "$TMP/sparse65m.json"     # 65 MiB, no disk used
truncate -s 2M "$TMP/sparse2m.devprop"
expect "graph /dev/zero"            2 IoError 'character device'    check /dev/zero
expect "graph FIFO (no writer)"     2 IoError 'FIFO'                check "$TMP/fifo.json"
expect "graph directory"            2 IoError 'directory'           check "$TMP/dir.json"
expect "graph 65 MiB sparse"        2 IoError 'limited to 64 MiB'   check "$TMP/sparse65m.json"
STDIN_FILE=<(yes '{') expect "graph /dev/stdin from a pipe" 2 IoError 'FIFO|not a regular file' check /dev/stdin
expect "devprop /dev/zero"          2 IoError 'character device'    build "$GRAPH" --device /dev/zero --no-cache
expect "devprop FIFO"               2 IoError 'FIFO'                build "$GRAPH" --device "$TMP/fifo.json" --no-cache
expect "devprop 2 MiB sparse"       2 IoError 'limited to 1 MiB'    build "$GRAPH" --device "$TMP/sparse2m.devprop" --no-cache

# ---------------------------------------------------------------- integers beyond int64 in device files
for v in 18446744073709551615 4294967386 1e400 123456789012345678901234567890 90.0 -90; do
  python3 - "$DEVPROP" "$TMP/dev_$v.devprop" "$v" <<'PYEOF'
import json, re, sys
text = open(sys.argv[1]).read()
out, n = re.subn(r'"deviceVer"\s*:\s*-?[0-9.eE+]+', '"deviceVer": ' + sys.argv[3], text)
assert n == 1, "deviceVer not found in the committed devprop"
open(sys.argv[2], "w").write(out)
PYEOF
  expect "devprop deviceVer = $v" 2 ParseError 'deviceVer|overflow' build "$GRAPH" --device "$TMP/dev_$v.devprop" --no-cache
done

# ---------------------------------------------------------------- .npy inputs (read before any GPU work)
# npy FILE SHAPE DATA_BYTES: a float32 .npy with that header and that many zero bytes.
npy() {
  python3 - "$@" <<'PYEOF'
import sys
path, shape, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape
h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
open(path, "wb").write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + b"\0" * nbytes)
PYEOF
}
npy "$TMP/overflow.npy" "(4294967296, 4294967296, 4294967296)" 16
npy "$TMP/huge_entry.npy" "(99999999999999999999999,)" 16
npy "$TMP/x_ok.npy" "(2, 8, 10, 10)" 6400
expect "npy shape product overflows" 2 ParseError 'overflow'          run "$GRAPH" --inputs "x=$TMP/overflow.npy"
expect "npy shape entry beyond int64" 2 ParseError 'too large'       run "$GRAPH" --inputs "x=$TMP/huge_entry.npy"
expect "npy /dev/zero"               2 IoError 'character device'    run "$GRAPH" --inputs "x=/dev/zero"
expect "npy FIFO"                    2 IoError 'FIFO'                run "$GRAPH" --inputs "x=$TMP/fifo.json"
truncate -s 100M "$TMP/sparse100m.npy"
expect "npy 100 MiB for a 6 KiB tensor" 2 IoError 'limited to'      run "$GRAPH" --inputs "x=$TMP/sparse100m.npy"

# ---------------------------------------------------------------- outputs that are inputs
cp "$GRAPH" "$TMP/g.json"
cp "$DEVPROP" "$TMP/d.devprop"
sum_before=$(cat "$TMP/g.json" "$TMP/d.devprop" | cksum)
expect "build --plan-out onto the graph file" 2 InvalidArgument 'same file as the graph file' \
  build "$TMP/g.json" --device "$TMP/d.devprop" --plan-out "$TMP/g.json" --no-cache
ln "$TMP/g.json" "$TMP/g_hardlink.json"
expect "build --plan-out onto a hard link of the graph" 2 InvalidArgument 'same file as the graph file' \
  build "$TMP/g.json" --device "$TMP/d.devprop" --plan-out "$TMP/g_hardlink.json" --no-cache
expect "build --plan-out onto the --device file" 2 InvalidArgument 'same file as the --device file' \
  build "$TMP/g.json" --device "$TMP/d.devprop" --plan-out "$TMP/d.devprop" --no-cache
expect "build --plan-out onto the plan cache" 2 InvalidArgument 'same file as the plan cache' \
  build "$TMP/g.json" --device "$TMP/d.devprop" --plan-out "$FUSEBOX_CACHE" --cache "$FUSEBOX_CACHE"
check "inputs untouched after refused writes" test "$(cat "$TMP/g.json" "$TMP/d.devprop" | cksum)" = "$sum_before"
mkdir -p "$TMP/outs"
npy "$TMP/outs/y.npy" "(2, 16, 5, 5)" 3200
expect "run --save-outputs over an --inputs file" 2 InvalidArgument 'same file as the --inputs file' \
  run "$GRAPH" --inputs "x=$TMP/x_ok.npy,b=$TMP/outs/y.npy" --save-outputs "$TMP/outs"
sed 's/"name": "y"/"name": "..\/escape"/; s/"outputs": {"y": "y"}/"outputs": {"y": "..\/escape"}/' "$GRAPH" > "$TMP/slash.json"
expect "run --save-outputs with a '/' in an output name" 2 InvalidArgument 'cannot be saved as a file name' \
  run "$TMP/slash.json" --save-outputs "$TMP/outs"

# ---------------------------------------------------------------- written files: links and special targets
printf 'precious\n' > "$TMP/victim"
ln -s "$TMP/victim" "$TMP/link.plan"
expect "build --plan-out onto a symbolic link" 2 IoError 'symbolic link' \
  build "$GRAPH" --device "$DEVPROP" --plan-out "$TMP/link.plan" --no-cache
check "the link's target is untouched" test "$(cat "$TMP/victim")" = precious
expect "build --plan-out onto a FIFO" 2 IoError 'FIFO' \
  build "$GRAPH" --device "$DEVPROP" --plan-out "$TMP/fifo.json" --no-cache
# A device node of our own, never /dev/null itself: a binary with this bug
# would replace the system's /dev/null with a regular file.
if mknod "$TMP/null" c 1 3 2>/dev/null; then
  expect "build --plan-out onto a character device" 2 IoError 'character device' \
    build "$GRAPH" --device "$DEVPROP" --plan-out "$TMP/null" --no-cache
  check "... which is still a device" test -c "$TMP/null"
else
  echo "SKIP  build --plan-out onto a character device: mknod needs root"
fi
expect "build --plan-out into a missing folder" 2 IoError 'temporary file' \
  build "$GRAPH" --device "$DEVPROP" --plan-out "$TMP/no/such/dir/p.plan" --no-cache
expect "build --plan-out ok" 0 "" 'plan written' build "$GRAPH" --device "$DEVPROP" --plan-out "$TMP/ok.plan" --no-cache
check "no temporary files left next to plans" test -z "$(ls -A "$TMP" | grep -E '\.tmp' || true)"

# ---------------------------------------------------------------- the plan cache
CACHE="$TMP/cache.sqlite"
expect "cache verify on a missing path"   2 IoError 'does not exist'  cache verify --cache "$TMP/missing.sqlite"
check "... and creates nothing" test ! -e "$TMP/missing.sqlite"
expect "cache ls on a missing path"       2 IoError 'does not exist'  cache ls --cache "$TMP/missing.sqlite"
expect "cache rm on a missing path"       2 IoError 'does not exist'  cache rm abc --cache "$TMP/missing.sqlite"
expect "cache export from a missing path" 2 IoError 'does not exist'  cache export "$TMP/x.sqlite" --cache "$TMP/missing.sqlite"
check "no cache file was created" test ! -e "$TMP/missing.sqlite"
expect "cache ls takes no argument"       2 InvalidArgument 'takes no argument'  cache ls extra --cache "$CACHE"
expect "cache clear takes no argument"    2 InvalidArgument 'takes no argument'  cache clear everything --cache "$CACHE"
expect "cache verify takes no argument"   2 InvalidArgument 'takes no argument'  cache verify x --cache "$CACHE"
expect "build fills the cache" 0 "" 'stored in the plan cache' build "$GRAPH" --device "$DEVPROP" --cache "$CACHE"
expect "cache rm says how many" 0 "" 'removed 0 entries' cache rm ffffffffffffffff --cache "$CACHE"
expect "build again" 0 "" 'plan cache hit' build "$GRAPH" --device "$DEVPROP" --cache "$CACHE"
expect "cache rm removes one" 0 "" 'removed 1 entry' cache rm "$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select key from entries").fetchone()[0][:4])' "$CACHE")" --cache "$CACHE"
expect "too small a cache: not stored, not claimed" 0 "" 'warning' \
  build "$GRAPH" --device "$DEVPROP" --cache "$TMP/tiny.sqlite" --cache-max-bytes 100
check "... and 'stored in the plan cache' is not printed" bash -c "! grep -q 'stored in the plan cache' '$TMP/stdout'"
run_fb build "$GRAPH" --device "$DEVPROP" --cache "$TMP/tiny.sqlite" --cache-max-bytes 100 --json
check "... and --json says cache_stored false" test "$(json_field "$TMP/stdout" 'd["cache_stored"]')" = False
expect "build fills the cache again" 0 "" 'stored' build "$GRAPH" --device "$DEVPROP" --cache "$CACHE"
expect "cache export onto the cache itself" 2 InvalidArgument "own file" cache export "$CACHE" --cache "$CACHE"
ln -s "$TMP/victim" "$TMP/export_link.sqlite"
expect "cache export onto a symbolic link" 2 IoError 'symbolic link' cache export "$TMP/export_link.sqlite" --cache "$CACHE"
check "the link's target is untouched" test "$(cat "$TMP/victim")" = precious
cp "$TMP/victim" "$TMP/notes.txt"
expect "cache export onto a file that is not a cache" 2 IoError 'not an SQLite' cache export "$TMP/notes.txt" --cache "$CACHE"
check "... which is left as it was" test "$(cat "$TMP/notes.txt")" = precious
expect "cache export" 0 "" 'wrote' cache export "$TMP/exported.sqlite" --cache "$CACHE"
expect "cache export merges into an existing export" 0 "" 'wrote' cache export "$TMP/exported.sqlite" --cache "$CACHE"
check "no temporary files left by exports" test -z "$(ls -A "$TMP" | grep -E '\.tmp' || true)"
expect "cache import from a FIFO"     2 IoError 'FIFO'              cache import "$TMP/fifo.json" --cache "$CACHE"
expect "cache import from /dev/zero"  2 IoError 'character device'  cache import /dev/zero --cache "$CACHE"
expect "cache import" 0 "" 'ok' cache import "$TMP/exported.sqlite" --cache "$CACHE"
ln -s "$CACHE" "$TMP/cache_link.sqlite"
expect "a symbolic link as the cache: refused" 2 IoError 'unavailable' cache ls --cache "$TMP/cache_link.sqlite"
check "... with a warning naming the link" grep -q 'symbolic link' "$TMP/stderr"
expect "build through a linked cache runs uncached" 0 "" 'symbolic link' \
  build "$GRAPH" --device "$DEVPROP" --cache "$TMP/cache_link.sqlite"

# ---------------------------------------------------------------- issue #32: outputs never destroy inputs
DC="$TMP/dotcache.sqlite"
expect "#32.1 a cache to draw over" 0 "" 'stored in the plan cache' build "$GRAPH" --device "$DEVPROP" --cache "$DC"
dc_sum=$(cksum < "$DC")
expect "#32.1 build --dot onto the plan cache" 2 InvalidArgument 'same file as the plan cache' \
  build "$GRAPH" --device "$DEVPROP" --cache "$DC" --dot="$DC"
check "... which is still the cache" test "$(cksum < "$DC")" = "$dc_sum"
expect "#32.1 build --dot onto a cache not created yet" 2 InvalidArgument 'same file as the plan cache' \
  build "$GRAPH" --device "$DEVPROP" --cache "$TMP/new-cache.sqlite" --dot="$TMP/new-cache.sqlite"
check "... and no cache was created" test ! -e "$TMP/new-cache.sqlite"
expect "#32.1 build --dot onto the cache's -wal" 2 InvalidArgument 'same file as the plan cache' \
  build "$GRAPH" --device "$DEVPROP" --cache "$DC" --dot="$DC-wal"
x_sum=$(cksum < "$TMP/x_ok.npy")
expect "#32.2 check --dot onto an --inputs file" 2 InvalidArgument 'same file as the --inputs file' \
  check "$GRAPH" --inputs "x=$TMP/x_ok.npy" --dot="$TMP/x_ok.npy"
check "... which is unchanged" test "$(cksum < "$TMP/x_ok.npy")" = "$x_sum"
expect "#32.2 build --dot and --plan-out to one file" 2 InvalidArgument 'each output needs a file of its own' \
  build "$GRAPH" --device "$DEVPROP" --no-cache --dot="$TMP/both.out" --plan-out "$TMP/both.out"
check "... nothing was written" test ! -e "$TMP/both.out"
# The cases below start from a valid cache of their own: where #32.1 is not refused (the code
# before issue 32), $DC holds DOT text by now and every later case would fail for that reason.
rm -f "$DC" "$DC-wal" "$DC-shm"
"$FB" build "$GRAPH" --device "$DEVPROP" --cache "$DC" >/dev/null 2>&1

# A killed writer's -wal/-shm beside an export target (#32.3), and a target
# another process holds open (#32.4).
python3 - "$DC" "$TMP/killed.sqlite" <<'PYEOF'
import os, shutil, signal, sqlite3, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copy(src, dst)
pid = os.fork()
if pid == 0:
    db = sqlite3.connect(dst)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA wal_autocheckpoint = 0")
    db.execute("DELETE FROM entries")  # a -wal whose pages, replayed over the export, would empty it
    db.commit()
    os.kill(os.getpid(), signal.SIGKILL)
os.waitpid(pid, 0)
assert os.path.exists(dst + "-wal") and os.path.getsize(dst + "-wal") > 0
PYEOF
expect "#32.3 cache export over a killed writer's side files" 0 "" 'wrote' \
  cache export "$TMP/killed.sqlite" --cache "$CACHE"
check "... leaves no stale -wal or -shm" test ! -e "$TMP/killed.sqlite-wal" -a ! -e "$TMP/killed.sqlite-shm"
expect "#32.3 ... and the export reads back whole" 0 "" '[1-9][0-9]* entries checked, 0 bad' cache verify --cache "$TMP/killed.sqlite"
check "... holding exactly the exported cache's entries" python3 -c '
import sqlite3, sys
keys = lambda p: sorted(r[0] for r in sqlite3.connect(p).execute("SELECT key FROM entries"))
sys.exit(0 if keys(sys.argv[1]) == keys(sys.argv[2]) and keys(sys.argv[1]) else 1)' "$TMP/killed.sqlite" "$CACHE"
cp "$DC" "$TMP/live.sqlite"
python3 - "$TMP/live.sqlite" "$TMP/live.ready" <<'PYEOF' &
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1])
db.execute("PRAGMA journal_mode = WAL")
db.execute("SELECT count(*) FROM entries").fetchall()
open(sys.argv[2], "w").close()
time.sleep(30)
PYEOF
LIVE_PID=$!
for _ in $(seq 100); do [ -e "$TMP/live.ready" ] && break; sleep 0.1; done
live_sum=$(cksum < "$TMP/live.sqlite")
expect "#32.4 cache export onto a cache open in another process" 2 InvalidArgument 'open in another connection or process' \
  cache export "$TMP/live.sqlite" --cache "$CACHE"
check "... which is unchanged" test "$(cksum < "$TMP/live.sqlite")" = "$live_sum"
kill "$LIVE_PID" 2>/dev/null; wait "$LIVE_PID" 2>/dev/null

# ---------------------------------------------------------------- issue #32: resource limits end in errors
# run_limited LIMIT_CMD ARGS...: fusebox under a ulimit; sets RC and $TMP/stderr.
run_limited() {
  local lim=$1
  shift
  CMD=("$@")
  bash -c "$lim; exec \"\$@\"" _ timeout "$MAX_SECS" "$FB" "$@" >"$TMP/stdout" 2>"$TMP/stderr" </dev/null
  RC=$?
}
mkdir -p "$TMP/fsize"
run_limited "ulimit -f 2" build "$GRAPH" --device "$DEVPROP" --no-cache --plan-out "$TMP/fsize/p.plan"
check "#32.5 --plan-out past ulimit -f: exit 2, not SIGXFSZ (got $RC)" test "$RC" -eq 2
check "... the error names the path and EFBIG" grep -q "fsize/p.plan'.*File too large" "$TMP/stderr"
check "... and no temporary file is left" test -z "$(ls -A "$TMP/fsize")"
mkdir -p "$TMP/fsize2"  # a folder of its own: the --plan-out case above must not decide this one
run_limited "ulimit -f 2" cache export "$TMP/fsize2/e.sqlite" --cache "$CACHE"
check "#32.5 cache export past ulimit -f: exit 2, not SIGXFSZ (got $RC)" test "$RC" -eq 2
check "... no temporary file, -wal or -shm is left" test -z "$(ls -A "$TMP/fsize2")"
# 16 MiB of graph text (8 Mi numbers, within the value limit) whose parsed form needs a few
# hundred MB, under an address-space limit 128 MiB above what `check` of a small graph needs.
python3 - "$TMP/oom.json" <<'PYEOF'
import sys
n = (1 << 23) - 64
open(sys.argv[1], "w").write('{"name": "g", "pad": [' + ",".join(["0"] * n) + ']}')
PYEOF
base_kb=""
for kb in $(seq 100000 50000 4000000); do
  if bash -c "ulimit -v $kb; exec \"\$@\"" _ "$FB" check "$GRAPH" >/dev/null 2>&1; then base_kb=$kb; break; fi
done
run_limited "ulimit -v $((${base_kb:-4000000} + 131072))" check "$TMP/oom.json"
check "#32.12 out of host memory: exit 2 (got $RC)" test "$RC" -eq 2
check "... says 'out of host memory while'" grep -q 'out of host memory while' "$TMP/stderr"
check "... not 'internal error'" bash -c "! grep -q 'internal error' '$TMP/stderr'"

# ---------------------------------------------------------------- issue #32: a cache file is data, never code
python3 - "$TMP" <<'PYEOF'
import sqlite3, sys
out = sys.argv[1]
ident = "PRAGMA application_id = 1178750808; PRAGMA user_version = 1;"
cols = ("key TEXT PRIMARY KEY NOT NULL, meta TEXT NOT NULL, {payload}, created_utc TEXT NOT NULL, "
        "stored_bytes INTEGER NOT NULL, last_used_us INTEGER NOT NULL")
def make(name, payload, rows):
    db = sqlite3.connect(out + "/" + name)
    db.executescript(ident + "CREATE TABLE entries(" + cols.format(payload=payload) + ");"
                     "CREATE INDEX entries_last_used ON entries(last_used_us);")
    db.executemany("INSERT INTO entries(key, meta, created_utc, stored_bytes, last_used_us) VALUES(?, '{}', '2026', 1, ?)",
                   [("%016x" % i, i) for i in range(rows)])
    db.commit()
make("generated.sqlite", "payload BLOB AS (zeroblob(900000000)) VIRTUAL", 1)
make("generated5000.sqlite", "payload BLOB AS (zeroblob(20000 + last_used_us)) VIRTUAL", 5000)
db = sqlite3.connect(out + "/wrongschema.sqlite")
db.executescript(ident + "CREATE TABLE entries(key TEXT PRIMARY KEY, blob BLOB);")
PYEOF
expect "#32.6 cache import: a generated payload column" 2 ParseError 'generated column.*expected exactly' \
  cache import "$TMP/generated.sqlite" --cache "$TMP/gen-import.sqlite"
expect "#32.7 cache import: 5,000 rows of a generated payload" 2 ParseError 'generated column' \
  cache import "$TMP/generated5000.sqlite" --cache "$TMP/gen-import.sqlite"
expect "#32.14 cache import: a wrong schema says what was expected" 2 ParseError 'expected exactly the table and index fusebox writes' \
  cache import "$TMP/wrongschema.sqlite" --cache "$TMP/gen-import.sqlite"
check "... and not 'not an error'" bash -c "! grep -q 'not an error' '$TMP/stderr'"
cp "$DC" "$TMP/trigger.sqlite"
python3 - "$TMP/trigger.sqlite" <<'PYEOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.executescript("CREATE TABLE junk(x); CREATE TRIGGER grow AFTER UPDATE ON entries BEGIN "
                 "INSERT INTO junk VALUES(zeroblob(200000000)); END;")
PYEOF
trig_size=$(du -k "$TMP/trigger.sqlite" | cut -f1)
expect "#32.8 a cache with a trigger: refused, the build runs uncached" 0 "" "trigger 'grow'" \
  build "$GRAPH" --device "$DEVPROP" --cache "$TMP/trigger.sqlite"
check "... and the file did not grow" test "$(du -k "$TMP/trigger.sqlite" | cut -f1)" -le "$trig_size"
check "... nor its -wal" bash -c "[ ! -e '$TMP/trigger.sqlite-wal' ] || [ \$(du -k '$TMP/trigger.sqlite-wal' | cut -f1) -lt 1024 ]"

# ---------------------------------------------------------------- issue #32: parsers
python3 - "$TMP/c8.npy" <<'PYEOF'
import sys
h = "{'descr': '<c8', 'fortran_order': False, 'shape': (2, 8, 10, 10), }"
h += " " * (63 - (10 + len(h)) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + bytes(12800))
PYEOF
expect "#32.14 an unsupported .npy dtype is bad input" 2 InvalidArgument "unsupported dtype '<c8'" \
  check "$GRAPH" --inputs "x=$TMP/c8.npy"
{ cat "$GRAPH"; printf '\0{"trailing": "text"}'; } > "$TMP/nul.json"
expect "#32.14 text after a NUL byte in a graph file" 2 InvalidArgument 'NUL byte' check "$TMP/nul.json"
sed 's/"name": "conv_bias_relu_small",/"name": "conv_bias_relu_small", "name": "other",/' "$GRAPH" > "$TMP/dupkey.json"
expect "#32.14 a duplicate key in a graph file" 2 InvalidArgument "key 'name' appears twice" check "$TMP/dupkey.json"

# ---------------------------------------------------------------- honest output
expect "--version" 0 "" 'fusebox [0-9]+\.[0-9]+\.[0-9]+' --version
check "--version names the frontend and cuDNN" grep -qE 'cuDNN Frontend 1\.[0-9]+.*|cuDNN 9\.' "$TMP/stdout"
run_fb check "$GRAPH"
check "check > /dev/full: baseline passes" test "$RC" -eq 0
"$FB" check "$GRAPH" > /dev/full 2> "$TMP/stderr"
RC=$?
check "check > /dev/full exits non-zero" test "$RC" -ne 0
check "... and says so on stderr" grep -q 'cannot write to standard output' "$TMP/stderr"
"$FB" check "$GRAPH" --json > /dev/full 2> "$TMP/stderr"
RC=$?
check "check --json > /dev/full exits non-zero" test "$RC" -ne 0

BADNAME="$TMP/bad"$'\xff\xfe'"name.json"
cp "$GRAPH" "$BADNAME"
expect "check --json on a missing file with invalid UTF-8 in its name" 2 IoError 'No such file' \
  check --json "$TMP/missing"$'\xff'".json"
check "... stdout is valid JSON" valid_json "$TMP/stdout"
expect "build --json with invalid UTF-8 in the graph path" 0 "" 'engine' \
  build "$BADNAME" --device "$DEVPROP" --no-cache --json
check "... stdout is valid JSON" valid_json "$TMP/stdout"

ESCNAME="$TMP/"$'\e]0;pwned\a\e[2J'"g.json"
cp "$GRAPH" "$ESCNAME"
expect "check: a file name with terminal escapes" 0 "" 'ok' check "$ESCNAME"
check "... prints no control bytes" no_control_bytes "$TMP/stdout" "$TMP/stderr"
expect "check: a missing file name with terminal escapes" 2 IoError 'x1B' check "$TMP/"$'\e[31mred\e[0m'".json"
check "... prints no control bytes" no_control_bytes "$TMP/stdout" "$TMP/stderr"
sed 's/"name": "conv_bias_relu_small"/"name": "g\\u001b[2J\\u009b31m"/; s/"name": "w"/"name": "w\\u0007"/; s/"w": "w"/"w": "w\\u0007"/' \
  "$GRAPH" > "$TMP/esc_names.json"
expect "check: names with escapes in the graph" 0 "" 'x1B' check "$TMP/esc_names.json"
check "... prints no control bytes" no_control_bytes "$TMP/stdout" "$TMP/stderr"
expect "build: names with escapes in the graph" 0 "" 'x1B' build "$TMP/esc_names.json" --device "$DEVPROP" --no-cache
check "... prints no control bytes" no_control_bytes "$TMP/stdout" "$TMP/stderr"
python3 - "$DEVPROP" "$TMP/esc_dev.devprop" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1])); d["deviceName"] = "H200\u001b]0;pwned\u0007"
open(sys.argv[2], "w").write(json.dumps(d))
PYEOF
expect "build: a device name with escapes is refused" 2 ParseError "'deviceName' contains a control character" \
  build "$GRAPH" --device "$TMP/esc_dev.devprop" --no-cache
check "... prints no control bytes" no_control_bytes "$TMP/stdout" "$TMP/stderr"

# A failed build shows the steps that ran, in text and in --json.
BR="$SRC/examples/graphs/invalid_sdpa_bottom_right_bias.json"
expect "failed build prints its steps" 1 NotSupported 'validate.*FAILED' build "$BR" --device "$DEVPROP" --no-cache
run_fb build "$BR" --device "$DEVPROP" --no-cache --json
check "failed build --json has ok=false and the failing step" test \
  "$(json_field "$TMP/stdout" '(d["ok"], [s["name"] for s in d["steps"]], d["steps"][-1]["ok"], bool(d["steps"][-1]["message"]))')" \
  = "(False, ['validate'], False, True)"

# ---------------------------------------------------------------- what would reach cuDNN's parsers
# Device files: checked by fusebox (schema, ranges, depth) before cuDNN sees them.
python3 - "$DEVPROP" "$TMP" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1])); out = sys.argv[2]
def w(name, obj=None, text=None):
    open(out + "/" + name + ".devprop", "w").write(text if text is not None else json.dumps(obj))
w("unknown_key", dict(d, futureField=1))
w("warp_zero", dict(d, warpSize=0))
w("sms_huge", dict(d, multiProcessorCount=1 << 40))
w("grid_short", dict(d, maxGridSize=[1, 2]))
w("no_name", {k: v for k, v in d.items() if k != "deviceName"})
w("deep", text='{"maxGridSize": ' + "[" * 100000 + "]" * 100000 + "}")
w("array", text="[1, 2]")
PYEOF
expect "devprop: an unknown key"          2 ParseError "'\"futureField\"' is not one cuDNN 9.19 to 9.27 writes" \
  build "$GRAPH" --device "$TMP/unknown_key.devprop" --no-cache
expect "devprop: warpSize 0"              2 ParseError "'warpSize' = 0 is out of range \[1, 1024\]" \
  build "$GRAPH" --device "$TMP/warp_zero.devprop" --no-cache
expect "devprop: 2^40 SMs"                2 ParseError "'multiProcessorCount' = 1099511627776 is out of range" \
  build "$GRAPH" --device "$TMP/sms_huge.devprop" --no-cache
expect "devprop: a 2-vector grid"         2 ParseError "'maxGridSize' must be an array of 3 integers" \
  build "$GRAPH" --device "$TMP/grid_short.devprop" --no-cache
expect "devprop: no deviceName"           2 ParseError "'deviceName' is missing" \
  build "$GRAPH" --device "$TMP/no_name.devprop" --no-cache
expect "devprop: 100,000 nested arrays"   2 ParseError 'nested deeper than 2 levels' \
  build "$GRAPH" --device "$TMP/deep.devprop" --no-cache
expect "devprop: not an object"           2 ParseError 'expected a JSON object' \
  build "$GRAPH" --device "$TMP/array.devprop" --no-cache

# Cache entries with a good checksum whose payload the frontend would crash on
# (a key Graph::deserialize reads unchecked, renamed; the XXH3 recomputed):
# verify names them, import skips them, build deletes one and rebuilds.
HC="$TMP/hostile.sqlite"
expect "hostile cache: filled by a build" 0 "" 'stored in the plan cache' build "$GRAPH" --device "$DEVPROP" --cache "$HC"
python3 - "$HC" <<'PYEOF'
import ctypes, ctypes.util, json, sqlite3, sys
lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
lib.XXH3_64bits.restype = ctypes.c_uint64
lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
db = sqlite3.connect(sys.argv[1])
key, meta, payload = db.execute("SELECT key, meta, payload FROM entries").fetchone()
payload = bytes(payload).replace(b"fe_workspace_size", b"fe_workspace_sizX")
m = json.loads(meta); m["xxh3"] = "%016x" % lib.XXH3_64bits(payload, len(payload))
db.execute("UPDATE entries SET meta = ?, payload = ? WHERE key = ?", (json.dumps(m), payload, key))
db.commit()
PYEOF
expect "hostile cache: verify names the entry and why" 1 "" "bad: plan cache entry [0-9a-f]{16}: plan payload field 'fe_workspace_sizX' is not written by the cuDNN frontend" \
  cache verify --cache "$HC"
expect "hostile cache: import skips it" 0 "" 'fe_workspace_sizX.*not imported' \
  cache import "$HC" --cache "$TMP/importer.sqlite"
expect "hostile cache: nothing was imported" 0 "" '0 entries checked, 0 bad' cache verify --cache "$TMP/importer.sqlite"
expect "hostile cache: build deletes it and rebuilds" 0 "" 'fe_workspace_sizX.*deleted' \
  build "$GRAPH" --device "$DEVPROP" --cache "$HC"
check "... and stores the rebuilt plan" grep -q 'stored in the plan cache' "$TMP/stdout"
expect "hostile cache: the next build is a hit" 0 "" 'plan cache hit' build "$GRAPH" --device "$DEVPROP" --cache "$HC"

# Graphs cuDNN would refuse at build time: refused by check.
python3 - "$TMP" <<'PYEOF'
import json, sys
out = sys.argv[1]
def relu(x_strides=None, y_strides=None, dims=(4, 4)):
    x = {"name": "x", "dims": list(dims)}
    if x_strides: x["strides"] = x_strides
    y = {"name": "y"}
    if y_strides: y["strides"] = y_strides
    return {"name": "g", "tensors": [x, y], "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]}
json.dump(relu([1, 1]), open(out + "/alias_in.json", "w"))
json.dump(relu(None, [2, 1]), open(out + "/alias_out.json", "w"))
json.dump(relu([1, 2, 3], None, (2, 2, 2)), open(out + "/alias_three.json", "w"))
ops = [{"op": "relu", "name": "r%d" % i, "inputs": {"x": "x" if i == 0 else "t%d" % (i - 1)},
        "outputs": {"y": "y" if i == 250 else "t%d" % i}} for i in range(251)]
json.dump({"name": "long", "tensors": [{"name": "x", "dims": [4]}, {"name": "y"}], "ops": ops},
          open(out + "/ops251.json", "w"))
PYEOF
expect "check: aliasing input strides"  2 InvalidArgument "tensor 'x' \(graph input\).*dims 0 and 1 overlap" check "$TMP/alias_in.json"
expect "check: aliasing output strides" 2 InvalidArgument "tensor 'y' \(graph output\).*dims 0 and 1 overlap" check "$TMP/alias_out.json"
expect "check: three dims that alias together" 2 InvalidArgument '8 elements fit in 7 addresses' check "$TMP/alias_three.json"
expect "check: 251 ops" 2 InvalidArgument "has 251 ops; cuDNN accepts at most 250 operations.*\[relu 'r250'\]" \
  check "$TMP/ops251.json"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
