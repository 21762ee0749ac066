// libFuzzer target: arbitrary bytes as a .npy file, through read_npy_for()
// (src/reference/host_tensor.cpp), the reader `run --inputs` uses. The first
// byte picks the tensor the file must feed (dtype and dims), the rest is the
// file. See fuzz/README.md.
//
// Properties: nothing crashes; an error is ParseError, InvalidArgument or
// NotSupported (never Internal); an accepted file gives a tensor of the
// requested element count.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fusebox/tensor.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "npy_reader_fuzzer: property violated: %s\n", what);
    abort();
  }
}

const std::string& scratch_path() {
  static const std::string p = [] {
    char tmpl[] = "/tmp/npy_reader_fuzzer.XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    return std::string(tmpl);
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  using namespace fusebox;
  ResolvedTensor t;
  t.name = "x";
  static const DType kTypes[] = {DType::kFP32, DType::kFP16, DType::kInt32, DType::kBF16};
  t.dtype = kTypes[data[0] & 3];
  static const std::vector<int64_t> kDims[] = {{2, 3}, {1}, {4, 1, 2}, {0, 5}};
  t.dims = kDims[(data[0] >> 2) & 3];
  t.strides.assign(t.dims.size(), 1);
  for (size_t i = t.dims.size(); i-- > 1;) t.strides[i - 1] = t.strides[i] * std::max<int64_t>(t.dims[i], 1);
  FILE* f = fopen(scratch_path().c_str(), "wb");
  if (!f) abort();
  if (size > 1) fwrite(data + 1, 1, size - 1, f);
  fclose(f);
  auto r = read_npy_for(scratch_path(), t);
  if (!r.ok()) {
    const auto c = r.status().code();
    check(c == StatusCode::kParseError || c == StatusCode::kInvalidArgument || c == StatusCode::kNotSupported,
          "unexpected error class");
    return 0;
  }
  int64_t n = 1;
  for (int64_t d : t.dims) n *= d;
  check(r->element_count() == n, "element count differs from the tensor's");
  return 0;
}
