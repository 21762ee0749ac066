#!/usr/bin/env bash
# ctest python_wheel: `pip wheel .` (pyproject.toml, scikit-build-core) packages
# the Python module with this build's libfusebox.so (FUSEBOX_WHEEL_LIBRARY: the
# packaging step only, nothing recompiled), the wheel is installed into a
# scratch folder and imported from there, from outside the checkout, and
# builds a plan deviceless with the device-properties file inside the wheel.
#   usage: tests/python/wheel_test.sh SOURCE_DIR LIBFUSEBOX WORK_DIR
set -uo pipefail
SRC=$1 LIB=$2 WORK=$3
fail() { echo "FAIL: $*"; exit 1; }
python3 -c 'import scikit_build_core' 2>/dev/null ||
  fail "scikit-build-core is not installed for python3 (scripts/setup.sh installs it)"
rm -rf "$WORK" && mkdir -p "$WORK" || fail "cannot make $WORK"
cd "$WORK" || exit 1
t0=$SECONDS
python3 -m pip wheel "$SRC" --no-build-isolation --no-deps -q -w dist \
  -C build-dir="$WORK/skbuild" -C cmake.define.FUSEBOX_WHEEL_LIBRARY="$LIB" >pip.log 2>&1 ||
  { cat pip.log; fail "pip wheel failed"; }
whl=$(ls dist/fusebox-*.whl 2>/dev/null | head -n1)
[ -n "$whl" ] || fail "no wheel in $WORK/dist"
echo "built $(basename "$whl") in $((SECONDS - t0)) s"
case "$(basename "$whl")" in *-py3-none-*) ;; *) fail "$(basename "$whl") is not a py3-none wheel" ;; esac
python3 - "$whl" <<'PY' || fail "wheel contents"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"fusebox/__init__.py", "fusebox/_lib.py", "fusebox/lib/libfusebox.so", "fusebox/devices/h200-cudnn-9.27.devprop"}
missing = need - names
assert not missing, f"missing from the wheel: {sorted(missing)}"
print("wheel holds", len(names), "files, among them", ", ".join(sorted(need)))
PY
python3 -m pip install -q --no-deps --target site "$whl" >>pip.log 2>&1 || { cat pip.log; fail "pip install --target"; }
# From a folder outside the checkout, with FUSEBOX_LIBRARY unset: the wheel's own library.
mkdir -p elsewhere && cd elsewhere || exit 1
env -u FUSEBOX_LIBRARY PYTHONPATH="$WORK/site" python3 - "$SRC" <<'PY' || fail "import from the wheel"
import os, sys
import fusebox
site = os.path.realpath(os.path.join(os.getcwd(), "..", "site"))
assert os.path.realpath(fusebox.__file__).startswith(site), fusebox.__file__
assert os.path.realpath(fusebox.library_path()).startswith(site), fusebox.library_path()
assert fusebox.devprop_path().startswith(site), fusebox.devprop_path()
g = fusebox.Graph.from_json(os.path.join(sys.argv[1], "examples/graphs/small/conv_bias_relu_small.json"))
plan = fusebox.Session(device_properties=fusebox.devprop_path()).build(g)
assert plan.engine.startswith("eng"), plan.engine
print(f"import from the wheel: fusebox {fusebox.version()} from {fusebox.library_path()}; "
      f"deviceless plan {plan.engine}, {plan.workspace_bytes} B workspace, {plan.source}")
PY
echo "python_wheel: ok"
