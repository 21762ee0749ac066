// A partitioned plan: several plans run in turn as one (issue 29: every valid
// graph runs). The parts and the temporaries between them; execution,
// serialization and deserialization of the whole.
#include "common/plan_parts.h"
#include "internal.h"

namespace fusebox {

Result<Plan> compose_partitioned_plan(const ResolvedGraph& whole, const GraphPartition& partition,
                                      std::vector<Plan> part_plans) {
  if (partition.parts.size() < 2 || part_plans.size() != partition.parts.size()) {
    return InvalidArgument("partitioned plan: " + std::to_string(part_plans.size()) + " plans for " +
                           std::to_string(partition.parts.size()) + " parts (2 or more, one each)");
  }
  auto parts = std::make_shared<PlanParts>();
  int64_t offset = 0;
  for (int t : partition.temporaries) {
    parts->temporaries.push_back({whole.tensors[t].name, offset});
    ResolvedTensor as_stored = whole.tensors[t];
    auto d = partition.temporary_dtypes.find(t);
    if (d != partition.temporary_dtypes.end()) as_stored.dtype = d->second;
    offset += (as_stored.storage_bytes() + 255) / 256 * 256;
    parts->temporary_dtypes.push_back({t, std::string(dtype_name(as_stored.dtype))});
  }
  parts->temporaries_bytes = offset;
  auto impl = std::make_unique<Plan::Impl>();
  int64_t largest = 0;
  std::string engines;
  for (size_t i = 0; i < part_plans.size(); ++i) {
    if (!part_plans[i].impl())
      return InvalidArgument("partitioned plan: part " + std::to_string(i) + " has no plan");
    if (part_plans[i].part_count() > 0)
      return InvalidArgument("partitioned plan: a part is itself partitioned");
    largest = std::max(largest, part_plans[i].workspace_bytes());
    engines += (i ? " | " : "") + part_plans[i].engine_name();
    parts->parts.push_back({partition.parts[i].first_op, partition.parts[i].op_count,
                            partition.parts[i].graph, std::move(part_plans[i])});
  }
  impl->engine = "partitioned[" + engines + "]";
  impl->workspace_bytes = offset + largest;
  for (const ResolvedTensor& t : whole.tensors) {
    if (t.uid > 0) {
      impl->uids[t.name] = t.uid;
      impl->tensor_bytes[t.name] = t.storage_bytes();
    }
  }
  impl->parts = std::move(parts);
  return Plan(std::move(impl));
}

namespace cudnn {

Status execute_parts(const PlanParts& p, GpuContext& ctx, const std::map<std::string, void*>& buffers,
                     void* workspace) {
  std::map<std::string, void*> all = buffers;
  auto* base = static_cast<char*>(workspace);
  for (const auto& [name, offset] : p.temporaries) all[name] = base + offset;
  void* part_workspace = base ? base + p.temporaries_bytes : nullptr;
  for (const auto& part : p.parts) {
    FUSEBOX_RETURN_IF_ERROR(part.plan.execute(ctx, all, part_workspace));
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> serialize_parts(const PlanParts& p) {
  std::vector<common::SerializedPart> out;
  for (const auto& part : p.parts) {
    if (part.plan.native()) {  // fusebox's own kernel: rebuilt by name (common/plan_parts.h)
      out.push_back({part.first_op, part.op_count, part.plan.engine_name(), {}});
      continue;
    }
    FUSEBOX_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, part.plan.serialize());
    out.push_back({part.first_op, part.op_count, part.plan.engine_name(), std::move(bytes)});
  }
  return common::encode_plan_parts(out, p.temporary_dtypes);
}

Result<Plan> deserialize_parts(const ResolvedGraph& g, const std::vector<uint8_t>& bytes,
                               const DeviceTarget& target, GpuContext* ctx) {
  common::TemporaryDtypes stored;
  FUSEBOX_ASSIGN_OR_RETURN(
      auto parts,
      common::decode_plan_parts(bytes.data(), bytes.size(), static_cast<int>(g.ops.size()), "plan", &stored));
  // One part over the whole graph on fusebox's own kernel: a native plan (Plan::serialize), not a
  // partition.
  if (parts.size() == 1 && parts[0].payload.empty() && parts[0].first_op == 0 &&
      parts[0].op_count == static_cast<int>(g.ops.size())) {
    BuildOptions by_name;
    by_name.engine = parts[0].engine;
    auto plan = build_plan(g, target, by_name, nullptr, ctx);
    if (!plan.ok() || !plan->native())
      return ParseError("plan: names fusebox's kernel '" + parts[0].engine +
                        "', which does not run this graph" +
                        (plan.ok() ? std::string() : ": " + plan.status().message()));
    return plan;
  }
  std::vector<std::pair<int, int>> ranges;
  for (const auto& p : parts) ranges.push_back({p.first_op, p.op_count});
  std::map<int, DType> dtypes;
  for (const auto& [t, name] : stored) {
    const auto d = parse_dtype(name);
    if (!d || t >= static_cast<int>(g.tensors.size()) || !g.tensors[t].is_virtual) {
      return ParseError("plan: partitioned plan: temporary " + std::to_string(t) + " (" + name +
                        ") is not a virtual tensor of this graph with a known dtype");
    }
    dtypes[t] = *d;
  }
  FUSEBOX_ASSIGN_OR_RETURN(GraphPartition partition, partition_at(g, ranges, dtypes));
  std::vector<Plan> plans;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].payload.empty()) {  // fusebox's own kernel, by name: no cuDNN plan to read
      BuildOptions by_name;
      by_name.engine = parts[i].engine;
      auto plan = build_plan(partition.parts[i].graph, target, by_name, nullptr, ctx);
      if (!plan.ok() || !plan->native()) {
        return ParseError("plan: partitioned plan: part " + std::to_string(i) + " names fusebox's kernel '" +
                          parts[i].engine + "', which does not run that part" +
                          (plan.ok() ? std::string() : ": " + plan.status().message()));
      }
      plans.push_back(std::move(plan).value());
      continue;
    }
    FUSEBOX_ASSIGN_OR_RETURN(Plan plan, deserialize_plan(partition.parts[i].graph, parts[i].payload, target,
                                                         ctx, parts[i].engine));
    plans.push_back(std::move(plan));
  }
  return compose_partitioned_plan(g, partition, std::move(plans));
}

}  // namespace cudnn
}  // namespace fusebox
