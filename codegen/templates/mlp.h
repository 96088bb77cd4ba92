// Kernel templates of the fused MLP (codegen/emit_mlp.cpp; device functions and the algorithm:
// kernels/fused_mlp.cuh); ${NAME} and ${PARAMS} are filled by codegen/emit_kernel.cpp's finish().
#pragma once

namespace pa::codegen::templates {

// fused-mlp forward: block-strided tiles of R rows; ${LAYERS} holds one kMlpForwardLayer per
// layer, each reading buffer `a` and writing `b`, then swapping them. Shared memory: the widest
// layer's weights (${WFLOATS} floats), then the two row buffers of R × ${MAXW}.
inline constexpr const char* kMlpForward = R"(
#include "kernels/fused_mlp.cuh"
extern "C" __global__ void __launch_bounds__(${T}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  extern __shared__ float pa_mlp_smem[];
  constexpr int R = ${R}, T = ${T}, TM = ${TM};
  float* const ws = pa_mlp_smem;
  for (long long tile = blockIdx.x; tile < ${TILES}; tile += gridDim.x) {
    float* a = ws + ${WFLOATS};
    float* b = a + R * ${MAXW};
    const long long row0 = tile * R;
    const int rows = (int)min((long long)R, ${ROWS} - row0);
    __syncthreads();  // the previous tile is done with the buffers
    pa::mlp::loadTile<T>(in0, row0 * ${K0}, rows * ${K0}, a);
${LAYERS}  }
}
)";

// One forward layer: its weights into shared memory, the layer over the tile, its output stored
// (a saved hidden output, or y).
inline constexpr const char* kMlpForwardLayer = R"(    // layer ${LAYER}: [${K}] -> [${N}], ${ACTNAME}${BIASNOTE}
    pa::mlp::loadWeights<${K}, ${N}, ${S}, T>(${W}, ws);
    __syncthreads();
    pa::mlp::layerForward<${K}, ${N}, ${S}, R, TM, T, ${ACT}, ${HASBIAS}>(a, ws, ${BIAS}, b, rows);
    __syncthreads();
    pa::mlp::storeTile<T>(${OUT}, row0 * ${N}, rows * ${N}, b);
    { float* const t = a; a = b; b = t; }
)";

// fused-mlp-grad: block-strided tiles of R rows (each block the same tiles on every run); per
// tile dz of the last layer from dy and y, then ${LAYERS}, one kMlpBackwardLayer per layer from the
// last down. Each block adds its tiles' dW and db into its slot of the workspace (${P} floats at
// scratch + blockIdx.x · ${P}); the last block to finish adds the ${C} slots in order into the
// outputs (${FINAL}). Shared memory: the widest layer's weights, then three row buffers h, dz,
// next of R × ${MAXW}.
inline constexpr const char* kMlpBackward = R"(
#include "kernels/fused_mlp.cuh"
extern "C" __global__ void __launch_bounds__(${T}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  extern __shared__ float pa_mlp_smem[];
  constexpr int R = ${R}, T = ${T}, TM = ${TM}, TK = ${TK};
  float* const ws = pa_mlp_smem;
  float* const h = ws + ${WFLOATS};
  float* const part = scratch + (long long)blockIdx.x * ${P};
  bool first = true;
  for (long long tile = blockIdx.x; tile < ${TILES}; tile += gridDim.x, first = false) {
    float* dz = h + R * ${MAXW};
    float* next = dz + R * ${MAXW};
    const long long row0 = tile * R;
    const int rows = (int)min((long long)R, ${ROWS} - row0);
    __syncthreads();  // the previous tile is done with the buffers
    pa::mlp::outputGrad<T, ${LASTACT}>(in0, ${Y}, row0 * ${NL}, rows * ${NL}, dz);
${LAYERS}  }
  if (first)  // a block without rows (an empty batch) adds zeros
    for (int e = threadIdx.x; e < ${P}; e += T) part[e] = 0.0f;
  if (!pa::mlp::lastBlockDone(reinterpret_cast<unsigned*>(scratch + ${C}LL * ${P}))) return;
${FINAL}}
)";

// One backward layer: its input h (x or the lower layer's saved output) and weights into shared
// memory, the tile's dW and db into the block's slot, then dh = dz·Wᵀ as the next dz (times the
// lower activation's derivative) or as dx (${DXSTEP}).
inline constexpr const char* kMlpBackwardLayer = R"(    // layer ${LAYER}: [${K}] -> [${N}], ${ACTNAME}${BIASNOTE}
    pa::mlp::loadTile<T>(${H}, row0 * ${K}, rows * ${K}, h);
    pa::mlp::loadWeights<${K}, ${N}, ${S}, T>(${W}, ws);
    __syncthreads();
    pa::mlp::weightGrad<${K}, ${N}, TK, T, ${HASBIAS}>(h, dz, rows, part + ${WOFF}, part + ${BOFF}, first);
${DXSTEP}    __syncthreads();
    { float* const t = dz; dz = next; next = t; }
)";

// dh = dz·Wᵀ: the lower layer's dz (Lower its activation), or dx (Lower -1, into ${DX}).
inline constexpr const char* kMlpInputGrad =
    R"(    pa::mlp::inputGrad<${K}, ${N}, ${S}, R, TM, T, ${LOWER}>(dz, ws, h, next, ${DX}, row0 * ${K}, rows);
)";

// The last block: output element e of a gradient is the sum of the slots' element OFF + e.
inline constexpr const char* kMlpFinalSum = R"(  for (int e = threadIdx.x; e < ${COUNT}; e += T) ${OUT}[e] = pa::mlp::sumSlots(scratch, ${C}, ${P}, ${OFF} + e);
)";

}  // namespace pa::codegen::templates
