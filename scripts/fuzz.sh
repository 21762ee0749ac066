#!/usr/bin/env bash
# Builds and runs one libFuzzer target (see fuzz/README.md).
#   scripts/fuzz.sh TARGET [seconds] [extra libFuzzer flags...]
# TARGET: graph_loader, plan_cache_entry, device_properties, plan_file, npy_reader, pipeline_loader,
# plan_cache_db, safetensors_header.
# Installs clang and the libFuzzer runtime (apt) when missing. Builds the
# target with CMake (-DFUSEBOX_FUZZ=ON, clang++; every fuzzer is a CMake target,
# CMakeLists.txt) in build-fuzz/cmake/, copies the seed corpus into
# build-fuzz/corpus-<target>/ (libFuzzer adds inputs there) and writes crashers
# to build-fuzz/artifacts-<target>/. One process, one core (a crash ends the
# run; add -fork=1 -ignore_crashes=1 to keep going).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-graph_loader}
seconds=${2:-600}
shift $(($# > 2 ? 2 : $#)) || true

# clang++ plus libclang_rt.fuzzer (Debian: clang + libclang-rt-dev).
need=()
command -v clang++ >/dev/null || need+=(clang)
dpkg -s libclang-rt-dev >/dev/null 2>&1 || need+=(libclang-rt-dev)
if ((${#need[@]})); then
  echo "fuzz: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
test -f third_party/cudnn-frontend/include/cudnn_frontend/thirdparty/nlohmann/json.hpp || bash scripts/setup.sh

# Each target's seeds and libFuzzer flags; CMake (FUSEBOX_FUZZ=ON, CMakeLists.txt) builds it.
case "$target" in
  graph_loader)
    seeds=$(find examples/graphs -name '*.json'; ls fuzz/regressions/graph_loader/* 2>/dev/null || true)
    run_flags=(-max_len=65536 -dict=fuzz/graph.dict) ;;
  plan_cache_entry)
    seeds=$(ls fuzz/corpus/plan_cache_entry/* fuzz/regressions/plan_cache_entry/* 2>/dev/null || true)
    run_flags=(-max_len=16384) ;;
  device_properties)
    seeds=$(ls devices/*.devprop fuzz/corpus/device_properties/* fuzz/regressions/device_properties/* 2>/dev/null || true)
    run_flags=(-max_len=4096 -dict=fuzz/devprop.dict) ;;
  plan_file)
    seeds=$(ls fuzz/corpus/plan_file/* fuzz/regressions/plan_file/* 2>/dev/null || true)
    run_flags=(-max_len=65536) ;;
  npy_reader)
    seeds=$(ls fuzz/corpus/npy_reader/* fuzz/regressions/npy_reader/* 2>/dev/null || true)
    run_flags=(-max_len=4096) ;;
  pipeline_loader)
    seeds=$(ls examples/pipelines/*.json fuzz/regressions/pipeline_loader/* 2>/dev/null || true)
    run_flags=(-max_len=16384 -dict=fuzz/pipeline.dict) ;;
  plan_cache_db)
    # Whole cache databases (raw bytes, or SQL run on a valid cache): import, lookup, verify.
    seeds=$(ls fuzz/corpus/plan_cache_db/* fuzz/regressions/plan_cache_db/* 2>/dev/null || true)
    run_flags=(-max_len=65536 -dict=fuzz/plan_cache_db.dict) ;;
  safetensors_header)
    seeds=$(ls fuzz/corpus/safetensors_header/* fuzz/regressions/safetensors_header/* 2>/dev/null || true)
    run_flags=(-max_len=16384) ;;
  *) echo "fuzz: unknown target '$target' (graph_loader, plan_cache_entry, device_properties, plan_file, npy_reader, pipeline_loader, plan_cache_db, safetensors_header)" >&2
     exit 2 ;;
esac
out=build-fuzz
mkdir -p "$out"
# One CMake build of every fuzzer (clang++ for C++, ASan + UBSan; nvcc stays the CUDA compiler,
# and nothing CUDA is built for these targets), configured once.
cm=$out/cmake
if [ ! -f "$cm/build.ninja" ]; then
  echo "fuzz: configuring $cm (FUSEBOX_FUZZ=ON, clang++)"
  cmake -S . -B "$cm" -G Ninja -DFUSEBOX_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE= >/dev/null
fi
echo "fuzz: building ${target}_fuzzer"
cmake --build "$cm" --target "${target}_fuzzer" -j "${FUZZ_JOBS:-$(nproc)}"
bin=$cm/${target}_fuzzer

corpus=$out/corpus-$target
artifacts=$out/artifacts-$target
mkdir -p "$corpus" "$artifacts"
for f in $seeds; do cp "$f" "$corpus/seed-$(basename "$(dirname "$f")")-$(basename "$f")"; done
echo "fuzz: running $bin for ${seconds}s on $(ls "$corpus" | wc -l) inputs"
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "${run_flags[@]}" "$@" "$corpus" 2>&1 | tee "$out/$target.log"
