// fusebox: host tensors, random inputs and .npy files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox {

// Host memory laid out exactly as the graph tensor is on the device:
// data.size() == storage_elements(dims, strides) * dtype_size_bytes(dtype).
struct HostTensor {
  DType dtype = DType::kFP32;
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  std::vector<uint8_t> data;

  static HostTensor like(const ResolvedTensor& t);  // zero-filled storage
  int64_t element_count() const;
  // Element at logical coordinates `idx` (size == dims.size()), as double.
  double at(const std::vector<int64_t>& idx) const;
  // All elements in logical row-major order, as float.
  std::vector<float> to_float_logical() const;
};

// Uniform random values in [lo, hi], rounded to the tensor's dtype; never a
// constant tensor. Deterministic in (seed, tensor name).
HostTensor random_tensor(const ResolvedTensor& t, uint64_t seed, double lo = -1.0, double hi = 1.0);

// A page table of paged attention (int32 [B,1,max_pages,1], SdpaOptions::paged)
// over a pool of num_pages pages: entry e (logical order) is perm[e % num_pages]
// for a seeded random permutation perm of the pool's pages, so entries are
// distinct while the pool holds B * max_pages pages and a sequence's pages are
// not in order (a reader that ignores the table reads the wrong keys).
// Deterministic in (seed, tensor name).
HostTensor random_page_table(const ResolvedTensor& t, uint64_t seed, int64_t num_pages);

// .npy holds the tensor in logical row-major order, whatever its strides.
// On read: numpy dtypes f2/f4/f8/i4/i8 are accepted; an f4 array can feed a
// bf16, fp16 or fp8 tensor (rounded to it). Shape must equal the tensor dims.
// With `same_kind`, an integer array cannot feed a float tensor either
// (pipeline weights: an int array there is a wrong file, not a conversion).
Result<HostTensor> read_npy_for(const std::string& path, const ResolvedTensor& t, bool same_kind = false);
// A 1-D integer .npy array (|u1, <u2, <i4, <i8; values that fit int32), e.g. a token
// stream, of at most `max_elements` elements (the file's size is bounded before it is read).
Result<std::vector<int32_t>> read_npy_int32_vector(const std::string& path, int64_t max_elements);
// Tensor `key` of a safetensors file (a model's weights as saved by torch or
// the safetensors package): F64/F32/F16/BF16/F8_E4M3/F8_E5M2 feed a float
// tensor (rounded to its dtype), I64/I32 an integer one; the shape must equal
// the tensor dims, or equal them once dims of 1 are dropped. Only the header
// (at most 100 MiB) and this tensor's bytes are read.
// The header's JSON is bounded (depth, values) before it is parsed.
Result<HostTensor> read_safetensors_for(const std::string& path, const std::string& key,
                                        const ResolvedTensor& t);
// The "__metadata__" string map of a safetensors file (empty when it has none).
Result<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path);
// One F32 tensor to write: `shape`'s element count of floats at `data` (logical order).
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};
// Writes the tensors (F32, in this order) and the metadata as a safetensors file, through
// a temporary file renamed over `path`: an interrupted write leaves the old file intact.
Status write_safetensors_f32(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                             const std::map<std::string, std::string>& metadata);
// read_safetensors_for() for many tensors of the same files (a pipeline's
// constants): each file's header is parsed once, on first use, and kept (as
// an index of its tensors, not the JSON) for the life of this object, keyed
// by path and identity (device, inode, size, modification time). Thread-safe:
// threads reading tensors of one file wait for the one parse.
class SafetensorsReader {
 public:
  SafetensorsReader();
  Result<HostTensor> read(const std::string& path, const std::string& key, const ResolvedTensor& t);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};
// bf16 and fp8 tensors are written as float32 (exact); others keep their type.
Status write_npy(const std::string& path, const HostTensor& t);

}  // namespace fusebox
