#!/usr/bin/env bash
# Builds and runs one libFuzzer target (see fuzz/README.md).
#   scripts/fuzz.sh TARGET [seconds] [extra libFuzzer flags...]
# TARGET: graph_loader, plan_cache_entry, device_properties, plan_file, npy_reader, pipeline_loader,
# plan_cache_db, safetensors_header.
# Installs clang and the libFuzzer runtime (apt) when missing. Builds into
# build-fuzz/ without configuring the CUDA project, copies the seed corpus into
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

out=build-fuzz
mkdir -p "$out"
flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Iinclude -Isrc/common/include -isystem third_party/cudnn-frontend/include/cudnn_frontend/thirdparty)
# The cuDNN frontend headers, cuDNN and the CUDA runtime (host code only, no nvcc).
cuda=${CUDA_HOME:-/usr/local/cuda}
cudnn_flags=(-isystem third_party/cudnn-frontend/include -isystem "$cuda/include")
cudnn_libs=(-L"$cuda/lib64" -Wl,-rpath,"$cuda/lib64" -lcudnn -lcudart -ldl)
case "$target" in
  graph_loader)
    srcs=(fuzz/graph_loader_fuzzer.cpp src/graph/*.cpp src/graph/ops/*.cpp src/common/*.cpp)
    flags+=(-Isrc/graph); libs=(-lxxhash)
    seeds=$(find examples/graphs -name '*.json'; ls fuzz/regressions/graph_loader/* 2>/dev/null || true)
    run_flags=(-max_len=65536 -dict=fuzz/graph.dict) ;;
  plan_cache_entry)
    srcs=(fuzz/plan_cache_entry_fuzzer.cpp src/cache/entry_codec.cpp src/common/*.cpp)
    flags+=(-Isrc/cache); libs=(-lxxhash)
    seeds=$(ls fuzz/corpus/plan_cache_entry/* fuzz/regressions/plan_cache_entry/* 2>/dev/null || true)
    run_flags=(-max_len=16384) ;;
  device_properties)
    # cuDNN's own parser runs too (handle-less, no GPU): links libcudnn.
    srcs=(fuzz/device_properties_fuzzer.cpp src/common/*.cpp); libs=("${cudnn_libs[@]}")
    flags+=("${cudnn_flags[@]}")
    seeds=$(ls devices/*.devprop fuzz/corpus/device_properties/* fuzz/regressions/device_properties/* 2>/dev/null || true)
    run_flags=(-max_len=4096 -dict=fuzz/devprop.dict) ;;
  plan_file)
    srcs=(fuzz/plan_file_fuzzer.cpp src/runtime/plan_file.cpp src/common/*.cpp src/graph/*.cpp src/graph/ops/*.cpp)
    flags+=(-Isrc/graph -Isrc/runtime); libs=(-lxxhash "${cudnn_libs[@]}")
    flags+=("${cudnn_flags[@]}" -DFUSEBOX_DEVPROP="\"$PWD/devices/h200-cudnn-9.19.devprop\"")
    seeds=$(ls fuzz/corpus/plan_file/* fuzz/regressions/plan_file/* 2>/dev/null || true)
    run_flags=(-max_len=65536) ;;
  npy_reader)
    srcs=(fuzz/npy_reader_fuzzer.cpp src/reference/host_tensor.cpp src/common/*.cpp src/graph/*.cpp src/graph/ops/*.cpp)
    flags+=(-Isrc/graph -Isrc/reference); libs=(-lxxhash)
    seeds=$(ls fuzz/corpus/npy_reader/* fuzz/regressions/npy_reader/* 2>/dev/null || true)
    run_flags=(-max_len=4096) ;;
  pipeline_loader)
    srcs=(fuzz/pipeline_loader_fuzzer.cpp src/runtime/pipeline.cpp src/graph/*.cpp src/graph/ops/*.cpp src/common/*.cpp)
    flags+=(-Isrc/graph -Isrc/runtime -DFUSEBOX_PIPELINE_DIR="\"$PWD/examples/pipelines\""); libs=(-lxxhash)
    seeds=$(ls examples/pipelines/*.json fuzz/regressions/pipeline_loader/* 2>/dev/null || true)
    run_flags=(-max_len=16384 -dict=fuzz/pipeline.dict) ;;
  plan_cache_db)
    # Whole cache databases (raw bytes, or SQL run on a valid cache): import, lookup, verify.
    srcs=(fuzz/plan_cache_db_fuzzer.cpp src/cache/*.cpp src/graph/*.cpp src/graph/ops/*.cpp src/common/*.cpp)
    flags+=(-Isrc/cache -Isrc/graph); libs=(-lsqlite3 -lxxhash)
    seeds=$(ls fuzz/corpus/plan_cache_db/* fuzz/regressions/plan_cache_db/* 2>/dev/null || true)
    run_flags=(-max_len=65536 -dict=fuzz/plan_cache_db.dict) ;;
  safetensors_header)
    srcs=(fuzz/safetensors_header_fuzzer.cpp src/reference/safetensors.cpp src/reference/host_tensor.cpp
          src/common/*.cpp src/graph/*.cpp src/graph/ops/*.cpp)
    flags+=(-Isrc/graph -Isrc/reference); libs=(-lxxhash)
    seeds=$(ls fuzz/corpus/safetensors_header/* fuzz/regressions/safetensors_header/* 2>/dev/null || true)
    run_flags=(-max_len=16384) ;;
  *) echo "fuzz: unknown target '$target' (graph_loader, plan_cache_entry, device_properties, plan_file, npy_reader, pipeline_loader, plan_cache_db, safetensors_header)" >&2
     exit 2 ;;
esac
bin=$out/${target}_fuzzer
echo "fuzz: building $bin"
clang++ "${flags[@]}" "${srcs[@]}" "${libs[@]}" -o "$bin"

corpus=$out/corpus-$target
artifacts=$out/artifacts-$target
mkdir -p "$corpus" "$artifacts"
for f in $seeds; do cp "$f" "$corpus/seed-$(basename "$(dirname "$f")")-$(basename "$f")"; done
echo "fuzz: running $bin for ${seconds}s on $(ls "$corpus" | wc -l) inputs"
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "${run_flags[@]}" "$@" "$corpus" 2>&1 | tee "$out/$target.log"
