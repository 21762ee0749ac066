// Execute-time shape override (cuDNN 9.21+, its workspace query 9.23+; issue 35, part 3): a plan
// built override-enabled for one shape of a symbolic graph serves the graph's other shapes with
// no build. What differs between the shapes (the non-virtual tensors' dims and strides) goes to
// cuDNN at every execute; everything else must be equal, or the shape is refused and built.
#include <string>
#include <utility>

#include "fusebox/cudnn_features.h"
#include "internal.h"
#include "ops/matmul_fold.h"

namespace fusebox {
namespace cudnn {
Result<ShapeOverride> shape_override_between(const ResolvedGraph& built_given, const ResolvedGraph& given) {
  const std::string where = "shape override of graph '" + given.name + "'";
  if (built_given.symbolic_id.empty() || built_given.symbolic_id != given.symbolic_id) {
    return InvalidArgument(where + ": it is not the symbolic graph the plan was built for (identity '" +
                           given.symbolic_id + "', the plan's '" + built_given.symbolic_id + "')");
  }
  if (built_given.ops.size() != given.ops.size() || built_given.tensors.size() != given.tensors.size()) {
    return InvalidArgument(where +
                           ": another number of ops or tensors than the graph the plan was built for");
  }
  // A value taken from a dim when the graph was resolved (a default scale, a reduction size) is
  // baked into the plan: a shape where one differs builds its own plan.
  for (size_t i = 0; i < given.ops.size(); ++i) {
    const ResolvedOp& a = built_given.ops[i];
    const ResolvedOp& b = given.ops[i];
    if (a.name != b.name || a.attrs.index() != b.attrs.index()) {
      return InvalidArgument(where + ": op " + std::to_string(i) + " is '" + b.name + "', the plan's is '" +
                             a.name + "'");
    }
    const std::string ja = op_resolved_attrs_json(built_given, a);
    const std::string jb = op_resolved_attrs_json(given, b);
    if (ja != jb) {
      return InvalidArgument(where + ": [" + std::string(op_type_name(b.attrs)) + " '" + b.name +
                             "'] has other attributes at this shape (" + jb + ") than at the plan's (" + ja +
                             ")");
    }
  }
  // As lowered: rank-4+ matmul graphs fold their batch dims (ops/matmul_fold.h).
  std::string note;
  const std::optional<ResolvedGraph> built_folded = fold_matmul_batch_dims(built_given, &note);
  const std::optional<ResolvedGraph> folded = fold_matmul_batch_dims(given, &note);
  if (built_folded.has_value() != folded.has_value()) {
    return InvalidArgument(where + ": its matmul batch dims fold at one shape and not at the other");
  }
  const ResolvedGraph& built = built_folded ? *built_folded : built_given;
  const ResolvedGraph& g = folded ? *folded : given;
  ShapeOverride out;
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const ResolvedTensor& a = built.tensors[i];
    const ResolvedTensor& t = g.tensors[i];
    if (a.name != t.name || a.uid != t.uid || a.is_virtual != t.is_virtual || a.dtype != t.dtype ||
        a.dims.size() != t.dims.size()) {
      return InvalidArgument(where + ": tensor '" + t.name + "' differs from the plan's '" + a.name +
                             "' in more than its dims (name, dtype, rank or role)");
    }
    if (a.scalar_value != t.scalar_value) {
      return InvalidArgument(where + ": the by-value scalar '" + t.name +
                             "' has another value at this shape (the plan holds the built shape's)");
    }
    if (t.is_virtual || t.scalar_value || t.uid <= 0) continue;  // cuDNN derives the virtual ones
    if (a.dims == t.dims && a.strides == t.strides) continue;
    out.uids.push_back(t.uid);
    out.shapes.push_back(t.dims);
    out.strides.push_back(t.strides);
  }
  return out;
}

}  // namespace cudnn

int64_t Plan::Impl::index_to_run() const {
  if (plan_index >= 0 || !graph) return plan_index;
  return static_cast<const cudnn::FeGraph*>(graph.get())->current_candidate();
}

bool Plan::shape_overridden() const { return impl_ && impl_->shape_override; }
bool Plan::serves_other_shapes() const { return impl_ && impl_->override_enabled; }

bool override_shapes_available() {
  const auto runtime = static_cast<int64_t>(cudnnGetVersion());
  return cudnn_feature_active("override_shapes", runtime) &&
         cudnn_feature_active("override_shape_workspace", runtime);
}

Result<Plan> plan_at_shape(const Plan& built, const ResolvedGraph& built_graph, const ResolvedGraph& g,
                           GpuContext& ctx) {
  const Plan::Impl* p = built.impl();
  if (!p || !p->graph || p->native || p->parts || !p->override_enabled || p->shape_override) {
    return InvalidArgument(
        "shape override of graph '" + g.name + "': engine '" + (p ? p->engine : "") +
        "' was not built override-enabled for its own shape (BuildOptions::override_shapes)");
  }
  if (!override_shapes_available()) {
    return NotSupported(
        "shape override needs cuDNN 9.23 or newer (override shapes and their workspace query); "
        "the loaded cuDNN is " +
        std::to_string(cudnnGetVersion()));
  }
  FUSEBOX_ASSIGN_OR_RETURN(cudnn::ShapeOverride o, cudnn::shape_override_between(built_graph, g));
  auto impl = std::make_unique<Plan::Impl>(*p);
  for (const ResolvedTensor& t : g.tensors) {
    if (impl->tensor_bytes.count(t.name)) impl->tensor_bytes[t.name] = t.storage_bytes();
  }
  if (o.uids.empty()) return Plan(std::move(impl));  // the built shape itself
  try {
    int64_t ws = 0;
    FUSEBOX_RETURN_IF_ERROR(
        cudnn::from_fe(p->graph->get_workspace_size_plan_at_index(ctx.impl()->handle, p->index_to_run(), ws,
                                                                  o.uids, o.shapes, o.strides),
                       "shape override of graph '" + g.name + "': workspace query"));
    if (ws < 0) {
      return Internal("shape override of graph '" + g.name + "': cuDNN answered a workspace of " +
                      std::to_string(ws) + " bytes");
    }
    impl->workspace_bytes = ws;
  }
  FUSEBOX_CATCH_ALL("shape override of graph '" + g.name + "'")
  impl->shape_override = std::make_shared<const cudnn::ShapeOverride>(std::move(o));
  return Plan(std::move(impl));
}

}  // namespace fusebox
