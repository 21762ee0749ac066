// libFuzzer target: safetensors files through SafetensorsReader, the reader a
// pipeline's constants use (src/reference/safetensors.cpp). See fuzz/README.md.
//
// The first byte picks the mode and the tensor asked for:
//   bit 0 = 0: the rest is the header's JSON text; the 8-byte length is put in
//              front and 64 bytes of data after it (header mutations);
//   bit 0 = 1: the rest is the whole file (length field included);
//   bits 1-2:  the tensor read: "w" F32 [2, 2], "b" BF16 [4], "i" I32 [1, 1, 3]
//              or "__metadata__".
// Each file is read twice through one reader (the second read is served from
// the parsed index) and once through a fresh one: the three results agree.
//
// Properties: nothing crashes; an error is ParseError, InvalidArgument or
// IoError (never Internal); an accepted tensor has the requested element count.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fusebox/tensor.h"

namespace {

using namespace fusebox;

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "safetensors_header_fuzzer: property violated: %s\n", what);
    abort();
  }
}

const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string tmpl = access("/dev/shm", W_OK) == 0 ? "/dev/shm/safetensors_fuzzer.XXXXXX"
                                                     : "/tmp/safetensors_fuzzer.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) abort();
    return std::string(buf.data());
  }();
  return dir;
}

ResolvedTensor tensor(const std::string& name, DType dtype, std::vector<int64_t> dims) {
  ResolvedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.dims = std::move(dims);
  t.strides.assign(t.dims.size(), 1);
  for (size_t i = t.dims.size(); i-- > 1;) t.strides[i - 1] = t.strides[i] * t.dims[i];
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const ResolvedTensor kTensors[] = {tensor("w", DType::kFP32, {2, 2}), tensor("b", DType::kBF16, {4}),
                                            tensor("i", DType::kInt32, {1, 1, 3}),
                                            tensor("__metadata__", DType::kFP32, {1})};
  const ResolvedTensor& t = kTensors[(data[0] >> 1) & 3];
  std::string file;
  if (data[0] & 1) {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    const uint64_t n = size - 1;
    for (int i = 0; i < 8; ++i) file += static_cast<char>((n >> (8 * i)) & 0xff);
    file.append(reinterpret_cast<const char*>(data + 1), size - 1);
    for (int i = 0; i < 64; ++i) file += static_cast<char>(i * 37);
  }
  // A new name each time: a reader keys its index by path and identity, and a
  // file rewritten within one clock tick keeps its size and mtime.
  static unsigned long counter = 0;
  ++counter;
  const std::string path = scratch_dir() + "/f" + std::to_string(counter);
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) abort();
  fwrite(file.data(), 1, file.size(), f);
  fclose(f);

  SafetensorsReader reader;
  auto first = reader.read(path, t.name, t);
  auto again = reader.read(path, t.name, t);
  auto fresh = read_safetensors_for(path, t.name, t);
  unlink(path.c_str());
  check(first.ok() == again.ok() && first.ok() == fresh.ok(), "the parsed index changed the result");
  if (!first.ok()) {
    const auto c = first.status().code();
    check(c == StatusCode::kParseError || c == StatusCode::kInvalidArgument || c == StatusCode::kIoError,
          "unexpected error class");
    check(first.status().message() == again.status().message(), "the parsed index changed the error");
    return 0;
  }
  int64_t n = 1;
  for (int64_t d : t.dims) n *= d;
  check(first->to_float_logical().size() == static_cast<size_t>(n), "wrong element count");
  check(first->data == again->data && first->data == fresh->data, "the parsed index changed the data");
  return 0;
}
