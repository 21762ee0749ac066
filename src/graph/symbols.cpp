// fusebox: symbolic dims: binding concrete values, checks, identity.
#include "symbols.h"

#include <cctype>
#include <charconv>
#include <cstdio>

#include "common/text.h"
#include "graph_limits.h"
#include "ops/ops.h"
#include "xxhash.h"

namespace fusebox {
namespace graph_symbols {

namespace {

std::string q(const std::string& s) { return graph_ops::squote(s); }

std::string range_text(const SymbolRange& r) {
  return "[" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
}

std::string declared_names(const GraphSpec& spec) {
  std::string s;
  for (const auto& [name, r] : spec.symbols) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "none" : s;
}

}  // namespace

bool is_symbol_name(std::string_view name) {
  if (name.empty() || name.size() > graph_limits::kMaxNameBytes) return false;
  if (std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::string symbol_use(const GraphSpec& spec, const std::string& symbol) {
  for (const auto& t : spec.tensors) {
    for (size_t i = 0; i < t.dim_symbols.size(); ++i) {
      if (t.dim_symbols[i] == symbol) return "dim " + std::to_string(i) + " of " + q(t.name);
    }
  }
  return "";
}

Status check_symbols(const GraphSpec& spec) {
  for (const auto& [name, r] : spec.symbols) {
    const std::string where = "symbol " + q(name) + ": ";
    if (!is_symbol_name(name)) {
      return InvalidArgument("symbols: \"" + common::printable(name) +
                             "\" is not a symbol name: letters, digits and '_', not starting with a digit");
    }
    if (r.min < 1 || r.max < r.min || r.max > graph_ops::kMaxDim) {
      return InvalidArgument(
          where + "range " + range_text(r) +
          " is not a range of dims: it needs 1 <= min <= max <= " + std::to_string(graph_ops::kMaxDim));
    }
    if (r.default_value < r.min || r.default_value > r.max) {
      return InvalidArgument(where + "default " + std::to_string(r.default_value) + " is outside its range " +
                             range_text(r));
    }
    if (r.value < r.min || r.value > r.max) {
      return InvalidArgument(where + "value " + std::to_string(r.value) + " is outside its range " +
                             range_text(r));
    }
  }
  for (const auto& t : spec.tensors) {
    if (t.dim_symbols.empty()) continue;
    const std::string where = "tensor " + q(t.name) + ": ";
    if (t.dim_symbols.size() != t.dims.size()) {
      return InvalidArgument(where + "has " + std::to_string(t.dims.size()) + " dims but " +
                             std::to_string(t.dim_symbols.size()) +
                             " dim_symbols entries (one per dim, \"\" for a number)");
    }
    bool any = false;
    for (size_t i = 0; i < t.dims.size(); ++i) {
      const std::string& s = t.dim_symbols[i];
      if (s.empty()) continue;
      any = true;
      auto it = spec.symbols.find(s);
      if (it == spec.symbols.end()) {
        return InvalidArgument(where + "dim " + std::to_string(i) + " is the symbol " + q(s) +
                               ", which 'symbols' does not declare (declared: " + declared_names(spec) + ")");
      }
      if (t.dims[i] != it->second.value) {
        return InvalidArgument(where + "dim " + std::to_string(i) + " is " + std::to_string(t.dims[i]) +
                               " but symbol " + q(s) + " is " + std::to_string(it->second.value) +
                               " (bind_shape() sets both)");
      }
    }
    if (!any) continue;
    if (!t.strides.empty()) {
      return InvalidArgument(where +
                             "has symbolic dims and explicit strides: strides cannot follow the shape; give "
                             "a 'layout' (e.g. \"nhwc\", \"row_major\") or leave them to inference");
    }
    if (!t.values.empty()) {
      return InvalidArgument(where +
                             "has symbolic dims and fixed 'values': their count cannot follow the shape");
    }
  }
  return Status::Ok();
}

}  // namespace graph_symbols

Result<GraphSpec> bind_shape(const GraphSpec& spec, const ShapeValues& values) {
  const std::string where = "[graph '" + spec.name + "'] ";
  if (spec.symbols.empty() && !values.empty()) {
    return InvalidArgument(where + "shape values (" + shape_text(values) +
                           ") given for a graph that declares no symbols: its dims are fixed");
  }
  GraphSpec out = spec;
  for (auto& [name, r] : out.symbols) r.value = r.default_value;
  for (const auto& [name, v] : values) {
    auto it = out.symbols.find(name);
    if (it == out.symbols.end()) {
      std::string names;
      for (const auto& [n, r] : spec.symbols) names += (names.empty() ? "" : ", ") + n;
      return InvalidArgument(where + "unknown symbol '" + name + "': the graph declares " + names);
    }
    const SymbolRange& r = it->second;
    if (v < r.min || v > r.max) {
      const std::string use = graph_symbols::symbol_use(spec, name);
      return InvalidArgument(where + "symbol '" + name + "'" + (use.empty() ? "" : " (" + use + ")") + " = " +
                             std::to_string(v) + " is outside its range [" + std::to_string(r.min) + ", " +
                             std::to_string(r.max) + "]");
    }
    it->second.value = v;
  }
  for (auto& t : out.tensors) {
    for (size_t i = 0; i < t.dim_symbols.size() && i < t.dims.size(); ++i) {
      if (t.dim_symbols[i].empty()) continue;
      auto it = out.symbols.find(t.dim_symbols[i]);
      if (it != out.symbols.end()) t.dims[i] = it->second.value;
    }
  }
  FUSEBOX_RETURN_IF_ERROR(graph_symbols::check_symbols(out));
  return out;
}

Result<ShapeValues> parse_shape_values(std::string_view text) {
  ShapeValues out;
  const auto bad = [&](std::string_view item, const std::string& why) {
    return InvalidArgument("shape '" + std::string(item) + "': " + why +
                           " (expected NAME=VALUE[,NAME=VALUE...], e.g. B=8,S=128)");
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) {
      if (end == text.size() && out.empty() && text.empty()) break;  // "": no values
      return bad(item, "an empty item");
    }
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) return bad(item, "no NAME=");
    const std::string name(item.substr(0, eq));
    if (name.size() > graph_limits::kMaxNameBytes) return bad(item.substr(0, 32), "the name is too long");
    const std::string_view num = item.substr(eq + 1);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (num.empty() || ec != std::errc() || p != num.data() + num.size() || v < 1) {
      return bad(item, "the value is not a positive integer");
    }
    if (!out.emplace(name, v).second) return bad(item, "symbol '" + name + "' is given twice");
    if (end == text.size()) break;
  }
  return out;
}

std::string shape_text(const ShapeValues& values) {
  std::string s;
  for (const auto& [name, v] : values) s += (s.empty() ? "" : ",") + name + "=" + std::to_string(v);
  return s;
}

Result<ShapeSweep> parse_shape_sweep(std::string_view text) {
  constexpr size_t kMaxValues = 4096;
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(
        "shapes '" + std::string(text.substr(0, 200)) + "': " + why +
        " (expected NAME=LO..HI, NAME=LO..HI:STEP or NAME=V1,V2,..., e.g. B=1..64 or S=16..512:16)");
  };
  const auto number = [](std::string_view s, int64_t& v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size() && v >= 1;
  };
  ShapeSweep out;
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) return bad("no NAME=");
  out.symbol = std::string(text.substr(0, eq));
  if (out.symbol.size() > graph_limits::kMaxNameBytes) return bad("the name is too long");
  std::string_view rest = text.substr(eq + 1);
  const size_t dots = rest.find("..");
  if (dots != std::string_view::npos) {
    std::string_view hi_text = rest.substr(dots + 2), step_text = "1";
    const size_t colon = hi_text.find(':');
    if (colon != std::string_view::npos) {
      step_text = hi_text.substr(colon + 1);
      hi_text = hi_text.substr(0, colon);
    }
    int64_t lo = 0, hi = 0, step = 0;
    if (!number(rest.substr(0, dots), lo) || !number(hi_text, hi) || !number(step_text, step)) {
      return bad("LO, HI and STEP must be positive integers");
    }
    if (hi < lo) return bad("HI is below LO");
    if ((hi - lo) / step + 1 > static_cast<int64_t>(kMaxValues)) {
      return bad("more than " + std::to_string(kMaxValues) + " values");
    }
    for (int64_t v = lo; v <= hi; v += step) out.values.push_back(v);
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t comma = rest.find(',', start);
    const std::string_view item =
        rest.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    int64_t v = 0;
    if (!number(item, v)) return bad("'" + std::string(item.substr(0, 32)) + "' is not a positive integer");
    if (out.values.size() == kMaxValues) return bad("more than " + std::to_string(kMaxValues) + " values");
    out.values.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<ShapeValues> sweep_shapes(const std::vector<ShapeSweep>& sweeps) {
  std::vector<ShapeValues> out{ShapeValues{}};
  for (const auto& s : sweeps) {
    std::vector<ShapeValues> next;
    for (const auto& base : out) {
      for (int64_t v : s.values) {
        ShapeValues one = base;
        one[s.symbol] = v;
        next.push_back(std::move(one));
      }
    }
    out = std::move(next);
  }
  if (sweeps.empty()) out.clear();
  return out;
}

ShapeValues current_shape(const GraphSpec& spec) {
  ShapeValues out;
  for (const auto& [name, r] : spec.symbols) out[name] = r.value;
  return out;
}

std::string symbolic_graph_id(const GraphSpec& spec) {
  if (spec.symbols.empty()) return "";
  // The JSON form writes symbolic dims by name and leaves the current values
  // out, so every shape of one graph writes the same text.
  GraphSpec s = spec;
  for (auto& [name, r] : s.symbols) r.value = r.default_value;
  const std::string text = graph_to_json(s, -1);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return hex;
}

}  // namespace fusebox
