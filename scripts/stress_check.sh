#!/usr/bin/env bash
# Measured bounds of `fusebox check` on the largest graphs the loader takes
# (docs/cli.md, "Time and memory of check"; ctest's stress_check):
#   scripts/stress_check.sh FUSEBOX_BIN
# Generates, in a temporary folder (nothing stored):
#   a) a graph file of exactly 64 MiB (the file limit): a relu chain with
#      256-byte names (the name limit), padded with spaces;
#   b) a 100,000-op relu chain (the op limit) with ops in declaration order;
#   c) the same chain with its ops in reverse order.
# Each resolves completely and is then refused by the last rule of resolve():
# more ops than cuDNN takes in one graph (exit 2, InvalidArgument). Asserts
# that exit and message, and a wall-time and peak-RSS bound per file; prints
# the measured numbers. Bounds (overridable): STRESS_MAX_SECS (default 15 s),
# STRESS_MAX_RSS_KB (default 800,000 KiB: 12 times the 64 MiB file).
set -uo pipefail
FB=${1:?usage: $0 FUSEBOX_BIN}
MAX_SECS=${STRESS_MAX_SECS:-15}
MAX_RSS_KB=${STRESS_MAX_RSS_KB:-800000}
TIME_BIN=/usr/bin/time
if [ ! -x "$TIME_BIN" ]; then echo "stress_check: need GNU time at $TIME_BIN (scripts/setup.sh)" >&2; exit 1; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fusebox_stress.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

python3 - "$TMP" <<'PYEOF'
import json, sys
out = sys.argv[1]
LIMIT = 64 << 20

def chain(n, name_of, reverse=False):
    ops = []
    for i in range(n):
        src = "x" if i == 0 else name_of("t", i - 1)
        dst = "y" if i == n - 1 else name_of("t", i)
        ops.append('{"op": "relu", "name": "%s", "inputs": {"x": "%s"}, "outputs": {"y": "%s"}}'
                   % (name_of("r", i), src, dst))
    if reverse:
        ops.reverse()
    return ('{"name": "stress", "tensors": [{"name": "x", "dims": [2, 3]}, {"name": "y"}], "ops": [\n'
            + ",\n".join(ops) + "\n]}\n")

short = lambda p, i: "%s%d" % (p, i)
long_ = lambda p, i: (p + str(i)).ljust(256, "n")   # 256 bytes: the name limit
per_op = len(chain(2, long_)) - len(chain(1, long_))
n = (LIMIT - 200) // per_op
text = chain(n, long_)
while len(text) > LIMIT:
    n -= 1
    text = chain(n, long_)
text = text[:-1] + " " * (LIMIT - len(text)) + "\n"
assert len(text) == LIMIT
open(out + "/a_64mib.json", "w").write(text)
open(out + "/b_chain_100k.json", "w").write(chain(100000, short))
open(out + "/c_chain_100k_reversed.json", "w").write(chain(100000, short, reverse=True))
print("generated: a) %d ops in %d bytes; b), c) 100000 ops" % (n, len(text)))
PYEOF

FAIL=0
for f in a_64mib b_chain_100k c_chain_100k_reversed; do
  "$TIME_BIN" -f '%e %M' -o "$TMP/time" timeout $((MAX_SECS * 3)) "$FB" check "$TMP/$f.json" \
    >"$TMP/stdout" 2>"$TMP/stderr"
  rc=$?
  read -r secs rss < <(tail -n 1 "$TMP/time")
  size=$(stat -c %s "$TMP/$f.json")
  echo "$f: $size bytes: exit $rc, ${secs} s, ${rss} KiB peak RSS"
  if [ "$rc" -ne 2 ] || ! grep -q "InvalidArgument: .*cuDNN accepts at most 250 operations" "$TMP/stderr"; then
    echo "FAIL $f: expected exit 2 and the op-count rule; stderr:"; head -c 400 "$TMP/stderr"; echo
    FAIL=1
  fi
  if awk -v s="$secs" -v m="$MAX_SECS" 'BEGIN { exit !(s > m) }'; then echo "FAIL $f: ${secs} s > ${MAX_SECS} s"; FAIL=1; fi
  if [ "${rss:-0}" -gt "$MAX_RSS_KB" ]; then echo "FAIL $f: ${rss} KiB > ${MAX_RSS_KB} KiB"; FAIL=1; fi
done
[ "$FAIL" -eq 0 ] && echo "stress_check: all within ${MAX_SECS} s and ${MAX_RSS_KB} KiB"
exit "$FAIL"
