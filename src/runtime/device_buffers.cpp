#include "device_buffers.h"

#include <algorithm>

#include "fusebox/runtime.h"

namespace fusebox::runtime {

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

Status DeviceBuffer::allocate(size_t bytes, const std::string& what) {
  bytes_ = bytes;
  if (bytes == 0) return Status::Ok();
  return cuda_status(cudaMalloc(&ptr_, bytes), "cudaMalloc " + std::to_string(bytes) + " bytes for " + what);
}

Status GraphBuffers::prepare(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
                             int input_sets, cudaStream_t stream) {
  input_sets = std::max(1, input_sets);
  inputs_.clear();
  inputs_.resize(static_cast<size_t>(input_sets));
  pointers_.assign(static_cast<size_t>(input_sets), {});
  for (const ResolvedTensor& t : g.tensors) {
    if (t.is_virtual || t.scalar_value) continue;
    if (t.is_input) {
      auto it = inputs.find(t.name);
      if (it == inputs.end()) return InvalidArgument("no data for input '" + t.name + "'");
      const HostTensor& h = it->second;
      if (h.data.size() != static_cast<size_t>(t.storage_bytes())) {
        return InvalidArgument("input '" + t.name + "' holds " + std::to_string(h.data.size()) +
                               " bytes; the tensor's storage needs " + std::to_string(t.storage_bytes()));
      }
      for (int s = 0; s < input_sets; ++s) {
        DeviceBuffer& b = inputs_[s][t.name];
        FUSEBOX_RETURN_IF_ERROR(b.allocate(h.data.size(), "input '" + t.name + "'"));
        FUSEBOX_RETURN_IF_ERROR(
            cuda_status(cudaMemcpyAsync(b.get(), h.data.data(), b.bytes(), cudaMemcpyHostToDevice, stream),
                        "upload '" + t.name + "'"));
        pointers_[s][t.name] = b.get();
      }
    } else {
      DeviceBuffer& b = outputs_[t.name];
      FUSEBOX_RETURN_IF_ERROR(b.allocate(static_cast<size_t>(t.storage_bytes()), "output '" + t.name + "'"));
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(cudaMemsetAsync(b.get(), 0xFF, b.bytes(), stream), "poison '" + t.name + "'"));
      for (auto& p : pointers_) p[t.name] = b.get();
    }
  }
  return Status::Ok();
}

void* GraphBuffers::device(const std::string& tensor) const {
  auto it = pointers_.front().find(tensor);
  return it == pointers_.front().end() ? nullptr : it->second;
}

int rotation_sets_for(const ResolvedGraph& g) {
  double input_bytes = 0;
  for (int i : g.input_tensors()) {
    if (!g.tensors[i].scalar_value) input_bytes += static_cast<double>(g.tensors[i].storage_bytes());
  }
  if (input_bytes <= 0) return 1;
  const double l2_bytes = 60.0 * 1024 * 1024;
  int sets = static_cast<int>(2 * l2_bytes / input_bytes) + 1;
  sets = std::min(sets, 16);
  sets = std::min(sets, static_cast<int>(8.0 * 1024 * 1024 * 1024 / input_bytes));
  return std::max(sets, 1);
}

}  // namespace fusebox::runtime

namespace fusebox {

int input_rotation_sets(const ResolvedGraph& g) { return runtime::rotation_sets_for(g); }

}  // namespace fusebox
