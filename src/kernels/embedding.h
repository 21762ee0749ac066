// fusebox kernels layer (private): the embedding lookup kernel (embedding.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

Result<std::shared_ptr<const NativeKernel>> make_embedding_kernel(const ResolvedGraph& g,
                                                                  const ResolvedOp& op,
                                                                  const EmbeddingAttrs& a);

}  // namespace fusebox::kernels
