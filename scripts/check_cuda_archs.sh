#!/usr/bin/env bash
# Whether BUILD_DIR compiles fusebox's own CUDA kernels for the GPU machine's sm_90 (the bundles'
# check: scripts/gpu_bundle.sh, scripts/gpu_train_bundle.sh). A build folder configured by hand for
# an older architecture only gives PTX that the driver compiles at load, without sm_80's bf16
# instructions, and every timing of fusebox's own kernels from it is off. Every fresh configure
# got CMAKE_CUDA_ARCHITECTURES=75 until session 37 (CMakeLists.txt set its default after
# project(), too late; the warning the bundle script printed went unread), so it is an error now;
# ALLOW_ARCH=1 lets such a build through with the warning.
#   usage: scripts/check_cuda_archs.sh BUILD_DIR
set -u
BUILD_DIR=${1:?usage: check_cuda_archs.sh BUILD_DIR}
archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null)
case ";$archs;" in
  *";90;"* | *";90-real;"* | *";90a;"* | *";all;"* | *";all-major;"* | *";native;"*) exit 0 ;;
esac
echo "check_cuda_archs: $BUILD_DIR builds CUDA for '$archs', not sm_90 (the H100/H200): reconfigure with" \
  "cmake -S . -B $BUILD_DIR -DCMAKE_CUDA_ARCHITECTURES='80;90' (the project's default) and rebuild," \
  "or set ALLOW_ARCH=1" >&2
[ "${ALLOW_ARCH:-0}" = 1 ]
