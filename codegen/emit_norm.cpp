// Emitters of the row-normalisation and rotary-embedding families: LayerNorm, RmsNorm (each
// optionally fused with a residual add) and their gradients; Rope.
#include <stdexcept>

#include "codegen/emit_internal.h"
#include "graph/node_attrs.h"

namespace pa::codegen::detail {

NodeKernels emitLayerNorm(const Ctx&) { throw std::logic_error("layer-norm: no CUDA kernel yet"); }
NodeKernels emitRmsNorm(const Ctx&) { throw std::logic_error("rms-norm: no CUDA kernel yet"); }
NodeKernels emitLayerNormGrad(const Ctx&) { throw std::logic_error("layer-norm-grad: no CUDA kernel yet"); }
NodeKernels emitRmsNormGrad(const Ctx&) { throw std::logic_error("rms-norm-grad: no CUDA kernel yet"); }
NodeKernels emitRope(const Ctx&) { throw std::logic_error("rope: no CUDA kernel yet"); }

}  // namespace pa::codegen::detail
