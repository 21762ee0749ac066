// fusebox: one tensor out of a safetensors file (include/fusebox/tensor.h).
//
// The format: 8 bytes little-endian N, then N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, then the data; offsets are relative to the byte
// after the header. Only the header and the one tensor's bytes are read, each
// bounded by what the header and the tensor allow, so a hostile file costs at
// most its header limit plus the tensor's size. The header's JSON is bounded
// in depth and values before parsing, and each file's header is parsed once
// (SafetensorsReader: an index kept by file identity for one pipeline load),
// however many constants come from it.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/dims_string.h"
#include "common/file_io.h"
#include "common/json_text.h"
#include "fusebox/tensor.h"
#include "tensor_util.h"

namespace fusebox {
namespace {

using common::dims_string;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

struct StType {
  const char* name;
  size_t bytes;
  bool is_float;
};
constexpr StType kTypes[] = {{"F64", 8, true},  {"F32", 4, true},     {"F16", 2, true},
                             {"BF16", 2, true}, {"F8_E4M3", 1, true}, {"F8_E5M2", 1, true},
                             {"I64", 8, false}, {"I32", 4, false}};

const StType* find_type(const std::string& s) {
  for (const StType& t : kTypes)
    if (s == t.name) return &t;
  return nullptr;
}

double load_element(const uint8_t* p, const std::string& type) {
  if (type == "F64") {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  if (type == "F32") {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (type == "F16" || type == "BF16") {
    unsigned short b;
    std::memcpy(&b, p, 2);
    return type == "F16" ? fp16_bits_to_float(b) : bf16_bits_to_float(b);
  }
  if (type == "F8_E4M3") return fp8_bits_to_float(*p, DType::kFP8E4M3);
  if (type == "F8_E5M2") return fp8_bits_to_float(*p, DType::kFP8E5M2);
  if (type == "I32") {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return static_cast<double>(v);
}

std::vector<int64_t> without_ones(const std::vector<int64_t>& d) {
  std::vector<int64_t> out;
  for (int64_t x : d)
    if (x != 1) out.push_back(x);
  return out;
}

}  // namespace

namespace {

// What a header says about one tensor: all that is kept of the parsed JSON.
struct StEntry {
  std::string dtype;
  bool shape_ok = true;  // every shape entry a non-negative integer
  std::vector<int64_t> shape;
  bool offsets_ok = true;  // two non-negative integers
  uint64_t begin = 0, end = 0;
  bool well_formed = true;  // {"dtype": string, "shape": [...], "data_offsets": [a, b]}
};

struct StHeader {
  uint64_t header_len = 0, data_size = 0;
  std::map<std::string, StEntry> tensors;  // without "__metadata__"
  std::map<std::string, std::string> metadata;
  bool metadata_ok = true;  // "__metadata__" absent, or an object of strings
};

// A header nests 3 levels (file, tensor, shape); __metadata__ is a flat
// string map. Deeper or larger JSON is not a safetensors header, and
// nlohmann's DOM would take ~40x its text first.
constexpr int kMaxHeaderDepth = 8;
constexpr size_t kMaxHeaderValues = size_t{8} << 20;

Result<std::shared_ptr<const StHeader>> parse_header(const std::string& path, std::ifstream& in,
                                                     uint64_t file_size) {
  const std::string where = path + ": ";
  uint8_t len_bytes[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(len_bytes), 8))
    return ParseError(where + "not a safetensors file: shorter than its 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    return ParseError(where + "safetensors header length " + std::to_string(header_len) +
                      " is over the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_len > file_size - 8)
    return ParseError(where + "truncated safetensors file: the header says " + std::to_string(header_len) +
                      " bytes, the file has " + std::to_string(file_size - 8) + " after the length");
  std::string header(static_cast<size_t>(header_len), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len)))
    return ParseError(where + "cannot read the safetensors header");
  const common::JsonTextLimit hit = common::scan_json_text(header, kMaxHeaderDepth, kMaxHeaderValues);
  if (hit.kind == common::JsonTextLimit::Kind::kDepth)
    return ParseError(where + "the safetensors header nests deeper than " + std::to_string(kMaxHeaderDepth) +
                      " levels at byte " + std::to_string(hit.byte + 1) + " (a header needs 3)");
  if (hit.kind == common::JsonTextLimit::Kind::kValues)
    return ParseError(where + "the safetensors header holds more than " + std::to_string(kMaxHeaderValues) +
                      " JSON values (at byte " + std::to_string(hit.byte + 1) + ")");
  if (hit.kind == common::JsonTextLimit::Kind::kNul)
    return ParseError(where + "the safetensors header holds a NUL byte at byte " +
                      std::to_string(hit.byte + 1));
  auto h = std::make_shared<StHeader>();
  h->header_len = header_len;
  h->data_size = file_size - 8 - header_len;
  {
    const nlohmann::json root = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object())
      return ParseError(where + "the safetensors header is not a JSON object");
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == "__metadata__") {
        h->metadata_ok = it.value().is_object();
        if (h->metadata_ok)
          for (auto m = it.value().begin(); m != it.value().end(); ++m) {
            if (!m.value().is_string()) {
              h->metadata_ok = false;
              break;
            }
            h->metadata[m.key()] = m.value().get<std::string>();
          }
        continue;
      }
      const nlohmann::json& e = it.value();
      StEntry t;
      t.well_formed = e.is_object() && e.contains("dtype") && e["dtype"].is_string() && e.contains("shape") &&
                      e["shape"].is_array() && e.contains("data_offsets") && e["data_offsets"].is_array() &&
                      e["data_offsets"].size() == 2;
      if (t.well_formed) {
        t.dtype = e["dtype"].get<std::string>();
        for (const auto& d : e["shape"]) {
          if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
            t.shape_ok = false;
            break;
          }
          t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
        }
        for (const auto& o : e["data_offsets"])
          if (!o.is_number_unsigned()) t.offsets_ok = false;
        if (t.offsets_ok) {
          t.begin = e["data_offsets"][0].get<uint64_t>();
          t.end = e["data_offsets"][1].get<uint64_t>();
        }
      }
      h->tensors[it.key()] = std::move(t);
    }
  }  // the DOM is freed here: only the index stays
  return std::shared_ptr<const StHeader>(std::move(h));
}

// Parsed headers by path and file identity (device, inode, size, mtime).
// Threads loading constants of one file wait for the one parse.
class HeaderCache {
 public:
  Result<std::shared_ptr<const StHeader>> get(const std::string& path, const struct stat& sb,
                                              std::ifstream& in) {
    const Key key{
        path, sb.st_dev, sb.st_ino, static_cast<int64_t>(sb.st_size), sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec};
    std::shared_ptr<Slot> slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [k, s] : slots_)
        if (k == key) slot = s;
      if (!slot) {
        slot = std::make_shared<Slot>();
        slots_.push_back({key, slot});
      }
    }
    std::lock_guard<std::mutex> lock(slot->mu);
    if (!slot->done) {
      slot->result = parse_header(path, in, static_cast<uint64_t>(sb.st_size));
      slot->done = true;
    }
    return slot->result;
  }

 private:
  struct Key {
    std::string path;
    dev_t dev;
    ino_t ino;
    int64_t size, mtime_s, mtime_ns;
    bool operator==(const Key&) const = default;
  };
  struct Slot {
    std::mutex mu;
    bool done = false;
    Result<std::shared_ptr<const StHeader>> result = Status(StatusCode::kInternal, "not parsed");
  };
  std::mutex mu_;
  std::vector<std::pair<Key, std::shared_ptr<Slot>>> slots_;
};

Result<HostTensor> read_safetensors_impl(HeaderCache& headers, const std::string& path,
                                         const std::string& key, const ResolvedTensor& t) {
  const std::string where = path + ": ";
  if (Status st = common::require_regular_file(path, "safetensors file"); !st.ok()) return st;
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(where + "cannot open the file");
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return IoError(where + "cannot stat the file");
  if (!S_ISREG(sb.st_mode)) return IoError(where + "is not a regular file");
  FUSEBOX_ASSIGN_OR_RETURN(std::shared_ptr<const StHeader> header, headers.get(path, sb, in));
  const uint64_t header_len = header->header_len, data_size = header->data_size;

  auto it = header->tensors.find(key);
  if (it == header->tensors.end()) {
    std::string some;
    int n = 0;
    for (auto k = header->tensors.begin(); k != header->tensors.end() && n < 5; ++k)
      some += std::string(n++ ? ", " : "") + "'" + k->first + "'";
    return InvalidArgument(where + "no tensor named '" + key + "' (the file holds " +
                           std::to_string(header->tensors.size()) + " tensors" +
                           (some.empty() ? "" : ", e.g. " + some) + ")");
  }
  const StEntry& e = it->second;
  const std::string what = where + "tensor '" + key + "': ";
  if (!e.well_formed)
    return ParseError(what +
                      "expected {\"dtype\": string, \"shape\": [ints], \"data_offsets\": [begin, end]}");
  const std::string& dtype = e.dtype;
  const StType* type = find_type(dtype);
  if (!type)
    return InvalidArgument(what + "dtype " + dtype +
                           " is not read (accepted: F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32)");
  if (!e.shape_ok) return ParseError(what + "shape entries must be non-negative integers");
  const std::vector<int64_t>& shape = e.shape;
  if (!e.offsets_ok) return ParseError(what + "data_offsets must be non-negative integers");
  const uint64_t begin = e.begin, end = e.end;
  if (begin > end || end > data_size)
    return ParseError(what + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                      "] fall outside the file's " + std::to_string(data_size) + " data bytes");
  const std::optional<int64_t> elements = common::checked_product(shape);
  const std::optional<int64_t> bytes =
      elements ? common::checked_mul(*elements, static_cast<int64_t>(type->bytes)) : std::nullopt;
  if (!bytes || static_cast<uint64_t>(*bytes) != end - begin)
    return ParseError(what + "shape " + dims_string(shape) + " of " + dtype +
                      " does not fill data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                      "]");
  if (type->is_float != dtype_is_float(t.dtype))
    return InvalidArgument(what + dtype + " cannot feed tensor '" + t.name + "' of dtype " +
                           std::string(dtype_name(t.dtype)) +
                           " (a float tensor needs a float one and an integer "
                           "tensor an integer one)");
  // Equal shapes, or equal once dims of 1 are dropped (a bias [384] for a [1, 1, 384] buffer).
  if (shape != t.dims && without_ones(shape) != without_ones(t.dims))
    return InvalidArgument(what + "shape " + dims_string(shape) + " does not match tensor '" + t.name +
                           "' dims " + dims_string(t.dims) + " (equal, or equal without the dims of 1)");

  std::vector<uint8_t> raw(static_cast<size_t>(*bytes));
  in.clear();
  in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
  if (!raw.empty() && !in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())))
    return ParseError(what + "cannot read its " + std::to_string(raw.size()) + " data bytes");
  HostTensor out = HostTensor::like(t);
  const size_t esize = dtype_size_bytes(out.dtype);
  reference_detail::for_each_element(out.dims, out.strides, [&](int64_t i, int64_t off) {
    store_element(out.data.data() + off * esize, out.dtype,
                  load_element(raw.data() + i * type->bytes, dtype));
  });
  return out;
}

}  // namespace

struct SafetensorsReader::Impl {
  HeaderCache headers;
};

SafetensorsReader::SafetensorsReader() : impl_(std::make_shared<Impl>()) {}

Result<HostTensor> SafetensorsReader::read(const std::string& path, const std::string& key,
                                           const ResolvedTensor& t) {
  try {
    return read_safetensors_impl(impl_->headers, path, key, t);
  } catch (const std::bad_alloc&) {
    return common::out_of_host_memory("reading tensor '" + key + "' of safetensors file '" + path + "'");
  }
}

Result<HostTensor> read_safetensors_for(const std::string& path, const std::string& key,
                                        const ResolvedTensor& t) {
  return SafetensorsReader().read(path, key, t);
}

Result<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path) {
  FUSEBOX_RETURN_IF_ERROR(common::require_regular_file(path, "safetensors file"));
  std::ifstream in(path, std::ios::binary);
  struct stat sb {};
  if (!in || ::stat(path.c_str(), &sb) != 0) return IoError(path + ": cannot open the file");
  try {
    FUSEBOX_ASSIGN_OR_RETURN(std::shared_ptr<const StHeader> header,
                             parse_header(path, in, static_cast<uint64_t>(sb.st_size)));
    if (!header->metadata_ok)
      return ParseError(path + ": the safetensors \"__metadata__\" must be an object of strings");
    return header->metadata;
  } catch (const std::bad_alloc&) {
    return common::out_of_host_memory("reading the header of safetensors file '" + path + "'");
  }
}

Status write_safetensors_f32(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : tensors) {
    const std::optional<int64_t> n = common::checked_product(e.shape);
    if (!n || (*n > 0 && !e.data))
      return InvalidArgument(path + ": tensor '" + e.name + "' has no data for shape " +
                             dims_string(e.shape));
    if (e.name == "__metadata__" || header.contains(e.name))
      return InvalidArgument(path + ": tensor name '" + e.name + "' is used twice or reserved");
    const uint64_t bytes = static_cast<uint64_t>(*n) * 4;
    header[e.name] = {{"dtype", "F32"}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i)
    len[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  FUSEBOX_ASSIGN_OR_RETURN(common::AtomicFile f, common::AtomicFile::create(path, "safetensors file"));
  FUSEBOX_RETURN_IF_ERROR(f.write(len));
  FUSEBOX_RETURN_IF_ERROR(f.write(text));
  for (const SafetensorsEntry& e : tensors) {
    const size_t n = static_cast<size_t>(*common::checked_product(e.shape));
    FUSEBOX_RETURN_IF_ERROR(f.write(std::string_view(reinterpret_cast<const char*>(e.data), n * 4)));
  }
  return f.commit();
}

}  // namespace fusebox
