// fusebox graph layer: typed reads from a parsed JSON document, with errors
// that name the file and the JSON path ("g.json: ops[2] ('conv1').stride[0]:
// expected an integer, got \"2\""). Shared by the graph parser and the op
// families' parse_json (src/graph/ops/).
// Never converts JSON to or from `float` (docs/architecture.md: the frontend
// specializes nlohmann's float serializer elsewhere): doubles and integers only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/status.h"

namespace fusebox {

class JsonReader {
 public:
  using json = nlohmann::json;
  explicit JsonReader(std::string_view origin) : origin_(origin) {}

  Status err(const std::string& path, const std::string& msg) const;
  Status expected(const std::string& path, const char* what, const json& v) const;
  // Unknown keys of `obj` are errors listing the accepted ones.
  Status check_fields(const std::string& path, const json& obj,
                      const std::vector<std::string_view>& accepted) const;

  Result<std::string> get_string(const std::string& path, const json& v) const;
  Result<int64_t> get_int(const std::string& path, const json& v) const;
  Result<std::vector<int64_t>> get_int_list(const std::string& path, const json& v) const;
  Result<DType> get_dtype(const std::string& path, const json& v) const;

  // Optional fields of object `obj` at `path`: left unchanged when absent.
  Status opt_bool(const json& obj, const std::string& path, const char* key, bool& out) const;
  Status opt_number(const json& obj, const std::string& path, const char* key,
                    std::optional<double>& out) const;
  Status opt_int(const json& obj, const std::string& path, const char* key,
                 std::optional<int64_t>& out) const;
  Status opt_int_list(const json& obj, const std::string& path, const char* key,
                      std::vector<int64_t>& out) const;

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

}  // namespace fusebox
