// fusebox: host tensors, deterministic random inputs, and .npy I/O.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <thread>

#include "common/checked_math.h"
#include "common/file_io.h"
#include "fusebox/tensor.h"
#include "tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::for_each_element;
using reference_detail::product;
using reference_detail::storage_span;

static_assert(std::endian::native == std::endian::little, ".npy I/O assumes a little-endian host");

// ---------------------------------------------------------------- HostTensor

HostTensor HostTensor::like(const ResolvedTensor& t) {
  HostTensor h;
  h.dtype = t.dtype;
  h.dims = t.dims;
  h.strides = t.strides;
  if (h.strides.size() != h.dims.size()) h.strides = reference_detail::dense_row_major(h.dims);
  h.data.assign(static_cast<size_t>(storage_span(h.dims, h.strides)) * dtype_size_bytes(h.dtype), 0);
  return h;
}

int64_t HostTensor::element_count() const { return product(dims); }

double HostTensor::at(const std::vector<int64_t>& idx) const {
  int64_t offset = 0;
  for (size_t i = 0; i < idx.size() && i < strides.size(); ++i) offset += idx[i] * strides[i];
  return load_element(data.data() + offset * dtype_size_bytes(dtype), dtype);
}

std::vector<float> HostTensor::to_float_logical() const {
  const int64_t n = std::max<int64_t>(element_count(), 0);
  std::vector<float> out(static_cast<size_t>(n));
  const size_t esize = dtype_size_bytes(dtype);
  const uint8_t* base = data.data();
  // Logical order is storage order (row-major strides): a plain run, bf16 and fp32 without a
  // call per element. Large tensors on several threads (the plan check reads outputs of 10^9).
  const bool row_major = common::logical_is_storage_order(dims, strides);
  reference_detail::parallel_for(n, 4.0, [&](int64_t begin, int64_t end) {
    if (!row_major) {
      reference_detail::for_each_element_in(dims, strides, begin, end, [&](int64_t i, int64_t off) {
        out[static_cast<size_t>(i)] = static_cast<float>(load_element(base + off * esize, dtype));
      });
      return;
    }
    if (dtype == DType::kFP32) {
      std::memcpy(out.data() + begin, base + begin * 4, static_cast<size_t>(end - begin) * 4);
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* p = base + i * static_cast<int64_t>(esize);
      if (dtype == DType::kBF16) {
        uint16_t b;
        std::memcpy(&b, p, 2);
        if ((b & 0x7FFFu) <= 0x7F80u) {  // not NaN: the top half of a float
          out[static_cast<size_t>(i)] = bf16_bits_to_float(b);
          continue;
        }
      }
      out[static_cast<size_t>(i)] = static_cast<float>(load_element(p, dtype));
    }
  });
  return out;
}

// ---------------------------------------------------------------- random_tensor

namespace {

// FNV-1a: a hash of the name that is the same on every platform (std::hash is not).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

HostTensor random_tensor(const ResolvedTensor& t, uint64_t seed, double lo, double hi) {
  HostTensor h = HostTensor::like(t);
  const size_t esize = dtype_size_bytes(h.dtype);
  uint8_t* base = h.data.data();
  if (t.scalar_value) {
    for_each_element(h.dims, h.strides, [&](int64_t, int64_t off) {
      store_element(base + off * esize, h.dtype, *t.scalar_value);
    });
    return h;
  }
  if (hi < lo) std::swap(lo, hi);
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(fnv1a(t.name))));
  // Values are drawn in logical order, so a tensor's values do not depend on its layout.
  if (dtype_is_float(h.dtype)) {
    // Counter-based (element i gets splitmix64(stream + i)), so large tensors
    // fill on several threads with the same values as on one.
    const uint64_t stream = rng();
    const int64_t n = h.element_count();
    const int64_t threads =
        std::clamp<int64_t>(n / (int64_t{1} << 20), 1, std::max(1u, std::thread::hardware_concurrency()));
    auto fill = [&](int64_t begin, int64_t end) {
      reference_detail::for_each_element_in(h.dims, h.strides, begin, end, [&](int64_t i, int64_t off) {
        const double u = static_cast<double>(splitmix64(stream + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
        store_element(base + off * esize, h.dtype, lo + u * (hi - lo));
      });
    };
    std::vector<std::thread> pool;
    for (int64_t k = 1; k < threads; ++k) pool.emplace_back(fill, n * k / threads, n * (k + 1) / threads);
    fill(0, n / threads);
    for (auto& th : pool) th.join();
  } else {
    // Small integers: the range [ceil(lo), floor(hi)], widened to [-4, 4] if it holds fewer than 2 values.
    int64_t ilo = static_cast<int64_t>(std::ceil(lo)), ihi = static_cast<int64_t>(std::floor(hi));
    if (ihi - ilo < 1) ilo = -4, ihi = 4;
    const uint64_t span = static_cast<uint64_t>(ihi - ilo + 1);
    for_each_element(h.dims, h.strides, [&](int64_t, int64_t off) {
      store_element(base + off * esize, h.dtype,
                    static_cast<double>(ilo + static_cast<int64_t>(rng() % span)));
    });
  }
  // Never constant: with a narrow range and a coarse dtype every draw could round alike.
  // (Element 0 differing from element 1 settles it without a full scan.)
  int64_t off0 = 0, off1 = 0;
  if (h.element_count() > 1) {
    reference_detail::for_each_element_in(h.dims, h.strides, 1, 2, [&](int64_t, int64_t off) { off1 = off; });
  }
  if (h.element_count() > 1 && std::memcmp(base + off0 * esize, base + off1 * esize, esize) == 0) {
    std::vector<float> v = h.to_float_logical();
    bool constant = true;
    for (float x : v) constant = constant && x == v[0];
    if (constant) {
      // Move element 1 to the nearest value the dtype can tell apart from
      // element 0, toward the middle of the range (out of it if it is narrower than one step).
      const double v0 = v[0];
      const double dir = v0 >= 0.5 * (lo + hi) ? -1.0 : 1.0;
      int64_t second = -1;
      for_each_element(h.dims, h.strides, [&](int64_t i, int64_t off) {
        if (i == 1) second = off;
      });
      uint8_t* p = base + second * esize;
      double step = dtype_is_float(h.dtype) ? std::max(std::fabs(v0), 1e-3) * 0x1.0p-12 : 1.0;
      for (int tries = 0; tries < 64; ++tries, step *= 2) {
        store_element(p, h.dtype, v0 + dir * step);
        if (load_element(p, h.dtype) != v0) break;
      }
    }
  }
  return h;
}

HostTensor random_page_table(const ResolvedTensor& t, uint64_t seed, int64_t num_pages) {
  HostTensor h = HostTensor::like(t);
  const int64_t n = h.element_count();
  if (num_pages < 1 || n < 1) return h;
  std::vector<int64_t> perm(static_cast<size_t>(num_pages));
  for (int64_t p = 0; p < num_pages; ++p) perm[static_cast<size_t>(p)] = p;
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(fnv1a(t.name) ^ 0x70616765ull)));
  // Fisher-Yates with our own draws (std::shuffle's are not the same on every platform).
  for (int64_t p = num_pages - 1; p > 0; --p) {
    std::swap(perm[static_cast<size_t>(p)], perm[static_cast<size_t>(rng() % static_cast<uint64_t>(p + 1))]);
  }
  const size_t esize = dtype_size_bytes(h.dtype);
  for_each_element(h.dims, h.strides, [&](int64_t i, int64_t off) {
    store_element(h.data.data() + off * static_cast<int64_t>(esize), h.dtype,
                  static_cast<double>(perm[static_cast<size_t>(i % num_pages)]));
  });
  return h;
}

// ---------------------------------------------------------------- .npy

namespace {

// numpy itself refuses headers over 10 kB by default; 1 MiB is generous.
constexpr int64_t kMaxNpyHeaderBytes = int64_t{1} << 20;

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  bool has_descr = false, has_fortran = false, has_shape = false;
  std::vector<int64_t> shape;
};

std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// Parses the Python dict literal of a .npy header, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  Status Parse(NpyHeader* h) {
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      FUSEBOX_RETURN_IF_ERROR(ParseString(&key));
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after key '" + key + "'");
      SkipSpace();
      // numpy's literal_eval keeps the last of repeated keys; refusing them
      // keeps fusebox from reading an array numpy reads differently.
      if ((key == "descr" && h->has_descr) || (key == "fortran_order" && h->has_fortran) ||
          (key == "shape" && h->has_shape))
        return Error("key '" + key + "' appears twice (each of 'descr', 'fortran_order', 'shape' once)");
      if (key == "descr") {
        FUSEBOX_RETURN_IF_ERROR(ParseString(&h->descr));
        h->has_descr = true;
      } else if (key == "fortran_order") {
        if (ConsumeWord("True"))
          h->fortran_order = true;
        else if (ConsumeWord("False"))
          h->fortran_order = false;
        else
          return Error("fortran_order must be True or False");
        h->has_fortran = true;
      } else if (key == "shape") {
        FUSEBOX_RETURN_IF_ERROR(ParseShape(&h->shape));
        h->has_shape = true;
      } else {
        return Error("unexpected key '" + key + "'");
      }
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    if (!h->has_descr || !h->has_fortran || !h->has_shape)
      return Error("header lacks one of 'descr', 'fortran_order', 'shape'");
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const {
    return ParseError("malformed header at offset " + std::to_string(pos_) + ": " + what);
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool Consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }
  bool ConsumeWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) return pos_ += w.size(), true;
    return false;
  }
  Status ParseString(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return Error("expected a quoted string");
    const char q = s_[pos_++];
    const size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status ParseShape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("shape must be a tuple");
    while (true) {
      SkipSpace();
      if (Consume(')')) return Status::Ok();
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9')
        return Error("shape entries must be non-negative integers");
      int64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return Error("shape entry too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 long suffix
      shape->push_back(v);
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume(')')) return Status::Ok();
      return Error("expected ',' or ')' in shape");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// The numpy type a .npy descr names; nullopt for any we do not read.
struct NpyType {
  bool is_float;
  size_t bytes;
};
std::optional<NpyType> parse_descr(const std::string& d) {
  if (d.size() != 3 || (d[0] != '<' && d[0] != '=' && d[0] != '|')) return std::nullopt;
  const std::string t = d.substr(1);
  if (t == "f2") return NpyType{true, 2};
  if (t == "f4") return NpyType{true, 4};
  if (t == "f8") return NpyType{true, 8};
  if (t == "i4") return NpyType{false, 4};
  if (t == "i8") return NpyType{false, 8};
  if (t == "u1") return NpyType{false, 1};  // unsigned: the 1- and 2-byte integer types read
  if (t == "u2") return NpyType{false, 2};  // (token streams)
  return std::nullopt;
}

double load_npy_element(const uint8_t* p, const NpyType& type) {
  if (type.is_float) {
    if (type.bytes == 2) {
      unsigned short b;
      std::memcpy(&b, p, 2);
      return fp16_bits_to_float(b);
    }
    if (type.bytes == 4) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    double f;
    std::memcpy(&f, p, 8);
    return f;
  }
  if (type.bytes == 1) return *p;
  if (type.bytes == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  if (type.bytes == 4) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return static_cast<double>(v);
}

// A .npy file's header, checked, and where its data starts: the data is exactly the
// shape's bytes at the dtype's size.
struct ParsedNpy {
  NpyHeader h;
  NpyType type{};
  const uint8_t* data = nullptr;
};

Result<ParsedNpy> parse_npy(const std::string& path, std::span<const uint8_t> bytes) {
  const std::string where = path + ": ";
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0)
    return ParseError(where + "not a .npy file (bad magic; expected \\x93NUMPY)");
  const int major = bytes[6];
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = bytes[8] | (static_cast<size_t>(bytes[9]) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return ParseError(where + "truncated .npy header");
    header_len = bytes[8] | (static_cast<size_t>(bytes[9]) << 8) | (static_cast<size_t>(bytes[10]) << 16) |
                 (static_cast<size_t>(bytes[11]) << 24);
    prefix = 12;
  } else {
    return ParseError(where + "unsupported .npy version " + std::to_string(major) + "." +
                      std::to_string(bytes[7]) + " (accepted: 1.x, 2.x, 3.x)");
  }
  if (header_len > kMaxNpyHeaderBytes - prefix)
    return ParseError(where + ".npy header length " + std::to_string(header_len) + " is larger than " +
                      std::to_string(kMaxNpyHeaderBytes - prefix) + " bytes");
  if (header_len > bytes.size() - prefix)
    return ParseError(where + "truncated .npy header (header length " + std::to_string(header_len) +
                      " but file has " + std::to_string(bytes.size()) + " bytes)");

  NpyHeader h;
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);
  if (Status st = HeaderParser(header_text).Parse(&h); !st.ok()) return st.WithContext(path);
  if (h.fortran_order)
    return InvalidArgument(
        where +
        "fortran_order=True arrays are not supported (save a C-ordered array, e.g. np.ascontiguousarray)");
  if (!h.descr.empty() && h.descr[0] == '>')
    return InvalidArgument(where + "big-endian dtype '" + h.descr +
                           "' is not supported (use '<' little-endian)");
  const std::optional<NpyType> type = parse_descr(h.descr);
  if (!type)
    return InvalidArgument(where + "unsupported dtype '" + h.descr +
                           "' (accepted: <f2, <f4, <f8, <i4, <i8, |u1, <u2)");
  // The header's own numbers first: a shape whose size overflows is an error, not a wrap.
  const std::optional<int64_t> shape_elements = common::checked_product(h.shape);
  const std::optional<int64_t> shape_bytes =
      shape_elements ? common::checked_mul(*shape_elements, static_cast<int64_t>(type->bytes)) : std::nullopt;
  if (!shape_bytes)
    return ParseError(where + "shape " + shape_tuple(h.shape) + " of '" + h.descr +
                      "' overflows: its element count times " + std::to_string(type->bytes) +
                      " bytes exceeds 2^63 - 1");
  const size_t data_bytes = static_cast<size_t>(*shape_bytes);
  const size_t have = bytes.size() - prefix - header_len;
  if (have != data_bytes)
    return ParseError(where + (have < data_bytes ? "truncated: " : "trailing bytes: ") + "has " +
                      std::to_string(have) + " data bytes, shape " + shape_tuple(h.shape) + " of '" +
                      h.descr + "' needs " + std::to_string(data_bytes));

  return ParsedNpy{std::move(h), *type, bytes.data() + prefix + header_len};
}

}  // namespace

Result<HostTensor> read_npy_for(const std::string& path, const ResolvedTensor& t, bool same_kind) {
  const std::string where = path + ": ";
  // The tensor bounds the file: its data at the widest accepted type (8 bytes)
  // plus a header. Checked before reading, so a huge or endless file costs nothing.
  const std::optional<int64_t> elements = common::checked_product(t.dims);
  const std::optional<int64_t> max_data = elements ? common::checked_mul(*elements, 8) : std::nullopt;
  if (!max_data || *max_data > std::numeric_limits<int64_t>::max() - kMaxNpyHeaderBytes) {
    return InvalidArgument(
        where + "tensor '" + t.name + "' dims " + dims_string(t.dims) +
        " are too large to read from a .npy file (element count times element size overflows)");
  }
  auto read =
      common::read_file_bounded(path, static_cast<uint64_t>(*max_data + kMaxNpyHeaderBytes), ".npy file");
  if (!read.ok()) {
    return read.status().WithContext("tensor '" + t.name + "' " + dims_string(t.dims) + " (at most " +
                                     std::to_string(*max_data) + " data bytes)");
  }
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(read->data()), read->size());

  FUSEBOX_ASSIGN_OR_RETURN(ParsedNpy parsed, parse_npy(path, bytes));
  const NpyHeader& h = parsed.h;
  const NpyType* type = &parsed.type;
  if (type->is_float && !dtype_is_float(t.dtype))
    return InvalidArgument(where + "float array '" + h.descr + "' cannot feed tensor '" + t.name +
                           "' of dtype " + std::string(dtype_name(t.dtype)) + " (save an integer array)");
  if (same_kind && !type->is_float && dtype_is_float(t.dtype))
    return InvalidArgument(where + "integer array '" + h.descr + "' cannot feed tensor '" + t.name +
                           "' of dtype " + std::string(dtype_name(t.dtype)) +
                           " (save a float array: <f2, <f4 or <f8)");

  // Shape must equal the tensor dims; a 0-d array feeds a tensor of one element.
  const bool scalar_ok = h.shape.empty() && product(t.dims) == 1;
  if (h.shape != t.dims && !scalar_ok)
    return InvalidArgument(where + "shape " + shape_tuple(h.shape) + " does not match tensor '" + t.name +
                           "' dims " + dims_string(t.dims));

  HostTensor out = HostTensor::like(t);
  const uint8_t* src = parsed.data;
  const size_t esize = dtype_size_bytes(out.dtype);
  for_each_element(out.dims, out.strides, [&](int64_t i, int64_t off) {
    store_element(out.data.data() + off * esize, out.dtype, load_npy_element(src + i * type->bytes, *type));
  });
  return out;
}

Result<std::vector<int32_t>> read_npy_int32_vector(const std::string& path, int64_t max_elements) {
  const std::string where = path + ": ";
  if (max_elements <= 0 || max_elements > (std::numeric_limits<int64_t>::max() - kMaxNpyHeaderBytes) / 8)
    return InvalidArgument(where + "read_npy_int32_vector: max_elements " + std::to_string(max_elements) +
                           " is out of range");
  FUSEBOX_ASSIGN_OR_RETURN(
      std::string read, common::read_file_bounded(
                            path, static_cast<uint64_t>(max_elements * 8 + kMaxNpyHeaderBytes), ".npy file"));
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(read.data()), read.size());
  FUSEBOX_ASSIGN_OR_RETURN(ParsedNpy parsed, parse_npy(path, bytes));
  if (parsed.type.is_float)
    return InvalidArgument(where + "float array '" + parsed.h.descr +
                           "' where integers are expected (accepted: |u1, <u2, <i4, <i8)");
  if (parsed.h.shape.size() != 1)
    return InvalidArgument(where + "shape " + shape_tuple(parsed.h.shape) + " where a 1-D array is expected");
  const int64_t n = parsed.h.shape[0];
  if (n > max_elements)
    return InvalidArgument(where + "holds " + std::to_string(n) + " elements, over the limit of " +
                           std::to_string(max_elements));
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double v = load_npy_element(parsed.data + i * static_cast<int64_t>(parsed.type.bytes), parsed.type);
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      return InvalidArgument(where + "element " + std::to_string(i) + " = " + std::to_string(v) +
                             " does not fit int32");
    out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return out;
}

Status write_npy(const std::string& path, const HostTensor& t) {
  std::string descr;
  size_t npy_bytes = 0;
  switch (t.dtype) {
    case DType::kFP16:
      descr = "<f2", npy_bytes = 2;
      break;
    case DType::kInt32:
      descr = "<i4", npy_bytes = 4;
      break;
    case DType::kInt64:
      descr = "<i8", npy_bytes = 8;
      break;
    case DType::kUInt8:
      descr = "|u1", npy_bytes = 1;
      break;
    default:
      descr = "<f4", npy_bytes = 4;
      break;  // fp32, and bf16/fp8 widened exactly
  }
  if (t.strides.size() != t.dims.size())
    return InvalidArgument(path + ": tensor has " + std::to_string(t.dims.size()) + " dims but " +
                           std::to_string(t.strides.size()) + " strides");
  const size_t esize = dtype_size_bytes(t.dtype);
  if (t.data.size() < static_cast<size_t>(storage_span(t.dims, t.strides)) * esize)
    return InvalidArgument(path + ": tensor data holds " + std::to_string(t.data.size()) +
                           " bytes, fewer than its " + "dims and strides span");

  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_tuple(t.dims) + ", }";
  // Pad with spaces so that the data starts on a 64-byte boundary, then '\n'.
  size_t prefix = 10;
  size_t total = prefix + header.size() + 1;
  if (total + (64 - total % 64) % 64 - prefix > 65535) prefix = 12;
  total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';

  std::string out;
  out.append("\x93NUMPY", 6);
  out += static_cast<char>(prefix == 10 ? 1 : 2);
  out += '\0';
  const size_t hl = header.size();
  out += static_cast<char>(hl & 0xff);
  out += static_cast<char>((hl >> 8) & 0xff);
  if (prefix == 12) {
    out += static_cast<char>((hl >> 16) & 0xff);
    out += static_cast<char>((hl >> 24) & 0xff);
  }
  out += header;
  const size_t data_start = out.size();
  out.resize(data_start + static_cast<size_t>(product(t.dims)) * npy_bytes);
  char* dst = out.data() + data_start;
  for_each_element(t.dims, t.strides, [&](int64_t i, int64_t off) {
    const uint8_t* src = t.data.data() + off * esize;
    if (descr == "<f4") {
      const float f = static_cast<float>(load_element(src, t.dtype));
      std::memcpy(dst + i * 4, &f, 4);
    } else {
      std::memcpy(dst + i * npy_bytes, src, npy_bytes);  // same type: copy bits
    }
  });

  return common::write_file_atomic(path, out, ".npy file");
}

}  // namespace fusebox
