// fusebox graph layer: what is shared by every op family, and the dispatch
// over OpAttrs that needs every alternative (type names).
#include "fusebox/op_traits.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

namespace {

// Calls fn(std::type_identity<T>{}) for every alternative T of OpAttrs.
template <typename Fn, size_t... I>
void for_each_alternative(Fn&& fn, std::index_sequence<I...>) {
  (fn(std::type_identity<std::variant_alternative_t<I, OpAttrs>>{}), ...);
}
template <typename Fn>
void for_each_alternative(Fn&& fn) {
  for_each_alternative(std::forward<Fn>(fn), std::make_index_sequence<std::variant_size_v<OpAttrs>>{});
}

}  // namespace

template <typename Fn>
void for_each_op_type(Fn&& fn) {
  for_each_alternative(std::forward<Fn>(fn));
}

std::optional<OpAttrs> attrs_for_type_name(std::string_view name) {
  std::optional<OpAttrs> found;
  for_each_alternative([&](auto tag) {
    if (!found) found = make_attrs(name, tag);
  });
  return found;
}

std::string accepted_type_names() {
  std::string s;
  for_each_alternative([&](auto tag) {
    for (std::string_view n : type_names(tag)) {
      if (!s.empty()) s += ", ";
      s += n;
    }
  });
  return s;
}

std::string squote(const std::string& s) { return "'" + s + "'"; }

Status check_dtype_in(const std::string& what, DType got, std::initializer_list<DType> allowed,
                      const std::string& why) {
  for (DType d : allowed)
    if (d == got) return Status::Ok();
  return InvalidArgument(what + " has dtype " + std::string(dtype_name(got)) + ": " + why);
}

std::string InferContext::in_where(std::string_view role) const {
  return where + " input '" + std::string(role) + "' (" + squote(in(role).name) + ")";
}

std::string InferContext::out_where(std::string_view role) const {
  return where + " output '" + std::string(role) + "' (" + squote(out(role).name) + ")";
}

}  // namespace fusebox::graph_ops

namespace fusebox {

std::string_view op_type_name(const OpAttrs& attrs) {
  return std::visit([](const auto& a) { return graph_ops::type_name(a); }, attrs);
}

std::vector<std::string_view> op_input_roles(const OpAttrs& attrs) {
  return std::visit([](const auto& a) { return graph_ops::input_roles(a); }, attrs);
}

std::vector<std::string_view> op_output_roles(const OpAttrs& attrs) {
  return std::visit([](const auto& a) { return graph_ops::output_roles(a); }, attrs);
}

std::string_view op_primary_output_role(const OpAttrs& attrs) { return op_output_roles(attrs).front(); }

std::string op_resolved_attrs_json(const ResolvedGraph& g, const ResolvedOp& op) {
  static const std::map<std::string, std::vector<double>> kNoInputs;
  const graph_ops::FlopsContext ctx{g, op, kNoInputs};
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  std::visit([&](const auto& a) { graph_ops::resolved_json(ctx, a, j); }, op.attrs);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

OpTraitsInfo op_traits(const OpAttrs& attrs) {
  return std::visit([](const auto& a) { return graph_ops::traits_info(a); }, attrs);
}

std::string op_not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op) {
  return std::visit([&](const auto& a) { return graph_ops::not_bit_reproducible(g, op, a); }, op.attrs);
}

std::vector<OpCatalogEntry> op_catalog() {
  std::vector<OpCatalogEntry> out;
  graph_ops::for_each_op_type([&](auto tag) {
    for (std::string_view name : graph_ops::type_names(tag)) {
      const std::optional<OpAttrs> attrs = graph_ops::make_attrs(name, tag);
      if (!attrs) continue;
      out.push_back({name, op_input_roles(*attrs), op_output_roles(*attrs), op_traits(*attrs)});
    }
  });
  return out;
}

}  // namespace fusebox
