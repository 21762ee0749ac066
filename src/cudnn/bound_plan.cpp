// BoundPlan: a plan bound once to its tensors in cuDNN's uid order.
#include <algorithm>

#include "bound_plan_impl.h"

namespace fusebox {

BoundPlan::BoundPlan() = default;
BoundPlan::BoundPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BoundPlan::BoundPlan(BoundPlan&&) noexcept = default;
BoundPlan& BoundPlan::operator=(BoundPlan&&) noexcept = default;
BoundPlan::~BoundPlan() = default;

Result<BoundPlan> BoundPlan::bind(const Plan& plan, GpuContext& ctx,
                                  const std::map<std::string, void*>& buffers,
                                  std::shared_ptr<const WorkspaceBinding> workspace) {
  using namespace cudnn;
  const Plan::Impl* p = plan.impl();
  if (!p || (!p->graph && !p->native && !p->parts)) return InvalidArgument("bind: empty plan");
  auto impl = std::make_unique<Impl>();
  impl->graph = p->graph;
  impl->fe = static_cast<const FeGraph*>(p->graph.get());
  impl->handle = ctx.impl()->handle;
  impl->stream = ctx.impl()->stream;
  impl->engine = p->engine;
  impl->workspace_bytes = p->workspace_bytes;
  impl->workspace = std::move(workspace);
  impl->shape_override = p->shape_override;
  for (const auto& [name, ptr] : buffers) {
    if (!p->uids.count(name)) {
      std::string known;
      for (const auto& [n, uid] : p->uids) known += " " + n;
      return InvalidArgument("bind '" + p->engine + "': '" + name +
                             "' is not a tensor of the plan; tensors are:" + known);
    }
  }
  if (p->parts) {  // a partitioned plan: every tensor of the whole graph, by uid
    impl->composite = &plan;
    impl->ctx = &ctx;
    std::vector<std::pair<int64_t, std::string>> by_uid;
    for (const auto& [name, uid] : p->uids) by_uid.push_back({uid, name});
    std::sort(by_uid.begin(), by_uid.end());
    for (const auto& [uid, name] : by_uid) {
      auto b = buffers.find(name);
      if (b == buffers.end() || b->second == nullptr)
        return InvalidArgument("bind '" + p->engine + "': no device buffer for tensor '" + name + "'");
      impl->names.push_back(name);
      impl->user_ptrs.push_back(b->second);
      impl->user_uids.push_back(uid);
      auto sz = p->tensor_bytes.find(name);
      impl->bytes.push_back(sz == p->tensor_bytes.end() ? -1 : sz->second);
    }
    return BoundPlan(std::move(impl));
  }
  if (p->native) {  // fusebox's own kernel: its tensors in its launch order, no variant pack
    impl->native = p->native;
    for (const std::string& name : p->native->tensors()) {
      auto b = buffers.find(name);
      if (b == buffers.end() || b->second == nullptr)
        return InvalidArgument("bind '" + p->engine + "': no device buffer for tensor '" + name + "'");
      impl->names.push_back(name);
      impl->user_ptrs.push_back(b->second);
      auto uid = p->uids.find(name);
      impl->user_uids.push_back(uid == p->uids.end() ? 0 : uid->second);
      auto sz = p->tensor_bytes.find(name);
      impl->bytes.push_back(sz == p->tensor_bytes.end() ? -1 : sz->second);
    }
    return BoundPlan(std::move(impl));
  }
  try {
    auto* graph = const_cast<FeGraph*>(impl->fe);
    FUSEBOX_RETURN_IF_ERROR(from_fe(graph->prepare_variant_pack_template(), "bind: prepare variant pack"));
    impl->plan_index = p->plan_index >= 0 ? p->plan_index : graph->current_candidate();
    const auto& t = graph->varpack_template;
    // The frontend's user slots are in ascending uid order: name them.
    std::unordered_map<int64_t, std::string> name_of;
    for (const auto& [name, uid] : p->uids) name_of[uid] = name;
    for (int slot : t.user_slots) {
      const int64_t uid = t.all_uids[slot];
      auto it = name_of.find(uid);
      if (it == name_of.end())
        return Internal("bind: cuDNN expects uid " + std::to_string(uid) + ", no tensor has it");
      auto b = buffers.find(it->second);
      if (b == buffers.end() || b->second == nullptr) {
        return InvalidArgument("bind '" + p->engine + "': no device buffer for tensor '" + it->second + "'");
      }
      impl->names.push_back(it->second);
      impl->user_ptrs.push_back(b->second);
      impl->user_uids.push_back(uid);
      auto sz = p->tensor_bytes.find(it->second);
      impl->bytes.push_back(sz == p->tensor_bytes.end() ? -1 : sz->second);
    }
    // Direct path unless the frontend has work of its own around the
    // backend call: workspace writes or auxiliary kernels, pointer
    // replacements, or a frontend-implemented engine.
    const fe::ExecutionPlan* ep = graph->execution_plan_at(impl->plan_index);
    int64_t total_ws = 0;
    FUSEBOX_RETURN_IF_ERROR(
        from_fe(graph->get_workspace_size_plan_at_index(impl->plan_index, total_ws), "bind"));
    const bool fe_work = impl->shape_override || !t.workspace_slots.empty() || !t.replacement_slots.empty() ||
                         !t.backend_slots.empty() || !ep || total_ws != ep->getWorkspaceSize();
    if (!fe_work) {
      impl->direct = true;
      impl->backend_plan = ep->get_raw_desc();
      impl->all_uids = t.all_uids;
      impl->all_ptrs = t.template_ptrs;  // by-value scalars point into the graph (kept alive above)
      for (size_t i = 0; i < t.user_slots.size(); ++i) {
        impl->user_slot_index.push_back(t.user_slots[i]);
        impl->all_ptrs[t.user_slots[i]] = impl->user_ptrs[i];
      }
      impl->alignment.assign(t.user_slots.size(), 1);
      for (const auto& [slot, alignment] : t.aligned_slots) {
        for (size_t i = 0; i < t.user_slots.size(); ++i) {
          if (t.user_slots[i] == slot) impl->alignment[i] = alignment;
        }
      }
      for (size_t i = 0; i < impl->names.size(); ++i) FUSEBOX_RETURN_IF_ERROR(impl->check_alignment(i));
      FUSEBOX_RETURN_IF_ERROR(impl->build_pack());
    } else {
      FUSEBOX_RETURN_IF_ERROR(impl->check_workspace());
    }
  }
  FUSEBOX_CATCH_ALL("bind")
  return BoundPlan(std::move(impl));
}

const std::vector<std::string>& BoundPlan::tensor_names() const {
  static const std::vector<std::string> none;
  return impl_ ? impl_->names : none;
}

int BoundPlan::slot_of(std::string_view name) const {
  if (!impl_) return -1;
  for (size_t i = 0; i < impl_->names.size(); ++i) {
    if (impl_->names[i] == name) return static_cast<int>(i);
  }
  return -1;
}

Status BoundPlan::rebind(int slot, void* ptr) {
  if (!impl_) return Internal("rebind: unbound plan");
  if (slot < 0 || slot >= static_cast<int>(impl_->names.size())) {
    return InvalidArgument("rebind '" + impl_->engine + "': slot " + std::to_string(slot) +
                           " is out of range (" + std::to_string(impl_->names.size()) + " tensors)");
  }
  if (ptr == nullptr)
    return InvalidArgument("rebind '" + impl_->engine + "': null pointer for '" + impl_->names[slot] + "'");
  void* old = impl_->user_ptrs[slot];
  impl_->user_ptrs[slot] = ptr;
  if (!impl_->direct) return Status::Ok();
  Status aligned = impl_->check_alignment(slot);
  if (!aligned.ok()) {
    impl_->user_ptrs[slot] = old;
    return aligned;
  }
  impl_->all_ptrs[impl_->user_slot_index[slot]] = ptr;
  return impl_->build_pack();
}

int64_t BoundPlan::tensor_bytes(int slot) const {
  if (!impl_ || slot < 0 || slot >= static_cast<int>(impl_->bytes.size())) return -1;
  return impl_->bytes[slot];
}

Status BoundPlan::check_buffer(int slot, int64_t buffer_bytes) const {
  if (!impl_) return Internal("rebind: unbound plan");
  if (slot < 0 || slot >= static_cast<int>(impl_->names.size())) {
    return InvalidArgument("rebind '" + impl_->engine + "': slot " + std::to_string(slot) +
                           " is out of range (" + std::to_string(impl_->names.size()) + " tensors)");
  }
  const int64_t need = impl_->bytes[slot];
  if (buffer_bytes < 0) {
    return InvalidArgument("rebind '" + impl_->engine + "': tensor '" + impl_->names[slot] +
                           "': buffer size " + std::to_string(buffer_bytes) +
                           " is negative; give the bytes the buffer holds (the tensor needs " +
                           std::to_string(need) + ")");
  }
  if (need >= 0 && buffer_bytes < need) {
    return InvalidArgument("rebind '" + impl_->engine + "': tensor '" + impl_->names[slot] + "' needs " +
                           std::to_string(need) + " bytes, the new buffer has " +
                           std::to_string(buffer_bytes));
  }
  return Status::Ok();
}

Status BoundPlan::rebind(int slot, void* ptr, int64_t buffer_bytes) {
  FUSEBOX_RETURN_IF_ERROR(check_buffer(slot, buffer_bytes));
  return rebind(slot, ptr);
}

Status BoundPlan::rebind(std::string_view name, void* ptr, int64_t buffer_bytes) {
  const int slot = slot_of(name);
  if (slot < 0) return rebind(name, ptr);  // the unknown-name error
  return rebind(slot, ptr, buffer_bytes);
}

Status BoundPlan::rebind(std::string_view name, void* ptr) {
  const int slot = slot_of(name);
  if (slot < 0) {
    std::string known;
    for (const auto& n : tensor_names()) known += " " + n;
    return InvalidArgument("rebind: '" + std::string(name) +
                           "' is not a tensor of the plan; tensors are:" + known);
  }
  return rebind(slot, ptr);
}

Status BoundPlan::execute() {
  if (!impl_) return Internal("execute: unbound plan");
  Impl& b = *impl_;
  if (b.composite) {
    FUSEBOX_RETURN_IF_ERROR(b.check_workspace());
    std::map<std::string, void*> buffers;
    for (size_t i = 0; i < b.names.size(); ++i) buffers[b.names[i]] = b.user_ptrs[i];
    return b.composite->execute(*b.ctx, buffers, b.ws_ptr());
  }
  if (b.native) {
    cudaStream_t stream = nullptr;  // the handle's: follows GpuContext::set_stream like cuDNN's executes
    FUSEBOX_RETURN_IF_ERROR(
        cudnn::cudnn_status(cudnnGetStream(b.handle, &stream), "execute: cudnnGetStream"));
    if (b.workspace_bytes > 0) FUSEBOX_RETURN_IF_ERROR(b.check_workspace());
    return b.native->launch_with_workspace(b.user_ptrs.data(), b.ws_ptr(), stream);
  }
  if (b.direct) {
    // A grown arena moved the workspace: rebuild the pack once.
    if (b.workspace && b.workspace->generation != b.workspace_generation)
      FUSEBOX_RETURN_IF_ERROR(b.build_pack());
    const cudnnStatus_t st = cudnnBackendExecute(b.handle, b.backend_plan, b.pack);
    if (st == CUDNN_STATUS_SUCCESS) return Status::Ok();
    return cudnn::cudnn_status(st, "execute '" + b.engine + "'");
  }
  FUSEBOX_RETURN_IF_ERROR(b.check_workspace());
  try {
    const int n = static_cast<int>(b.user_ptrs.size());
    if (const auto& o = b.shape_override) {
      return cudnn::from_fe(b.fe->execute_plan_at_index(b.handle, b.user_ptrs.data(), n, b.ws_ptr(),
                                                        b.plan_index, o->uids, o->shapes, o->strides),
                            "execute '" + b.engine + "' (shapes overridden)");
    }
    return cudnn::from_fe(
        b.fe->execute_plan_at_index(b.handle, b.user_ptrs.data(), n, b.ws_ptr(), b.plan_index),
        "execute '" + b.engine + "'");
  }
  FUSEBOX_CATCH_ALL("execute")
}

const std::string& BoundPlan::engine_name() const {
  static const std::string empty;
  return impl_ ? impl_->engine : empty;
}
int64_t BoundPlan::workspace_bytes() const { return impl_ ? impl_->workspace_bytes : 0; }
bool BoundPlan::direct() const { return impl_ && impl_->direct; }
void* BoundPlan::cudnn_handle() const { return impl_ ? impl_->handle : nullptr; }
void* BoundPlan::backend_plan() const { return impl_ && impl_->direct ? impl_->backend_plan : nullptr; }
void* BoundPlan::backend_variant_pack() const { return impl_ && impl_->direct ? impl_->pack : nullptr; }

}  // namespace fusebox
