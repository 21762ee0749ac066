// fusebox graph layer: typed JSON reads with path-naming errors (json_reader.h).
#include "json_reader.h"

namespace fusebox {

namespace {

std::string type_and_value(const nlohmann::json& v) {
  std::string dump = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (dump.size() > 40) dump = dump.substr(0, 37) + "...";
  if (v.is_string() || v.is_number() || v.is_boolean() || v.is_null()) return dump;  // strings already quoted
  return std::string(v.is_array() ? "an array " : "an object ") + dump;
}

}  // namespace

Status JsonReader::err(const std::string& path, const std::string& msg) const {
  return InvalidArgument(origin_ + ": " + path + ": " + msg);
}

Status JsonReader::expected(const std::string& path, const char* what, const json& v) const {
  return err(path, std::string("expected ") + what + ", got " + type_and_value(v));
}

Status JsonReader::check_fields(const std::string& path, const json& obj,
                                const std::vector<std::string_view>& accepted) const {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (std::string_view a : accepted) ok = ok || it.key() == a;
    if (!ok) {
      std::string list;
      for (std::string_view a : accepted) {
        if (!list.empty()) list += ", ";
        list += a;
      }
      return err(path, "unknown field '" + it.key() + "': accepted fields are " + list);
    }
  }
  return Status::Ok();
}

Result<std::string> JsonReader::get_string(const std::string& path, const json& v) const {
  if (!v.is_string()) return expected(path, "a string", v);
  return v.get<std::string>();
}

Result<int64_t> JsonReader::get_int(const std::string& path, const json& v) const {
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return err(path, "integer " + v.dump() + " is out of range");
    return static_cast<int64_t>(u);
  }
  if (!v.is_number_integer()) return expected(path, "an integer", v);
  return v.get<int64_t>();
}

Result<std::vector<int64_t>> JsonReader::get_int_list(const std::string& path, const json& v) const {
  if (!v.is_array()) return expected(path, "an array of integers", v);
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    FUSEBOX_ASSIGN_OR_RETURN(int64_t x, get_int(path + "[" + std::to_string(i) + "]", v[i]));
    out.push_back(x);
  }
  return out;
}

Result<DType> JsonReader::get_dtype(const std::string& path, const json& v) const {
  FUSEBOX_ASSIGN_OR_RETURN(std::string s, get_string(path, v));
  auto t = parse_dtype(s);
  if (!t)
    return err(path,
               "unknown dtype \"" + s + "\": accepted dtypes are " + std::string(dtype_accepted_names()));
  return *t;
}

Status JsonReader::opt_bool(const json& obj, const std::string& path, const char* key, bool& out) const {
  if (!obj.contains(key)) return Status::Ok();
  if (!obj[key].is_boolean()) return expected(path + "." + key, "true or false", obj[key]);
  out = obj[key].get<bool>();
  return Status::Ok();
}

Status JsonReader::opt_number(const json& obj, const std::string& path, const char* key,
                              std::optional<double>& out) const {
  if (!obj.contains(key)) return Status::Ok();
  if (!obj[key].is_number()) return expected(path + "." + key, "a number", obj[key]);
  out = obj[key].get<double>();
  return Status::Ok();
}

Status JsonReader::opt_int(const json& obj, const std::string& path, const char* key,
                           std::optional<int64_t>& out) const {
  if (!obj.contains(key)) return Status::Ok();
  FUSEBOX_ASSIGN_OR_RETURN(out, get_int(path + "." + key, obj[key]));
  return Status::Ok();
}

Status JsonReader::opt_int_list(const json& obj, const std::string& path, const char* key,
                                std::vector<int64_t>& out) const {
  if (!obj.contains(key)) return Status::Ok();
  FUSEBOX_ASSIGN_OR_RETURN(out, get_int_list(path + "." + key, obj[key]));
  return Status::Ok();
}

}  // namespace fusebox
