// Kernel templates of the fused MLP (codegen/emit_mlp.cpp; device functions and the algorithm:
// kernels/fused_mlp.cuh); ${NAME} and ${PARAMS} are filled by codegen/emit_kernel.cpp's finish().
// Shared memory is one dynamic array `sm`; every ${...OFF} is a float offset into it (a multiple
// of 4) that the emitter lays out.
#pragma once

namespace pa::codegen::templates {

// fused-mlp forward: block-strided tiles of R rows. ${PROLOGUE} starts the copies that come
// before the first tile (every layer's weights where they all fit), ${LOOP} is the tile loop's
// head, ${LAYERS} one kMlpForwardLayer per layer.
inline constexpr const char* kMlpForward = R"(
#include "kernels/fused_mlp.cuh"
extern "C" __global__ void __launch_bounds__(${T}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  extern __shared__ __align__(16) float pa_mlp_smem[];
  constexpr int R = ${R}, T = ${T};
  float* const sm = pa_mlp_smem;
  const long long tiles = ${TILES}, batch = ${ROWS};
  long long tile = blockIdx.x;
  int rows = (int)max(0LL, min((long long)R, batch - tile * R));
${PROLOGUE}  ${LOOP} {
    const long long row0 = tile * R;
    rows = (int)min((long long)R, batch - row0);
${LAYERS}  }
  pa::mlp::waitGroups<0>();
}
)";

// The forward's tile loops: with the weights resident (`first`: the first tile, whose copies the
// prologue started) or streamed.
inline constexpr const char* kMlpLoopResident = "for (bool first = true; tile < tiles; tile += gridDim.x, first = false)";
inline constexpr const char* kMlpLoopStreamed = "for (; tile < tiles; tile += gridDim.x)";

// One forward layer: ${BEFORE} (its copies, waits and barrier), then the layer over the tile,
// its output kept in shared memory for the next layer and stored to global memory (a saved
// hidden output, or y); ${AFTER} (the next tile's rows, once layer 1 no longer reads them).
inline constexpr const char* kMlpForwardLayer = R"(    // layer ${LAYER}: [${K}] -> [${N}], ${ACTNAME}${BIASNOTE}; ${TILING}
${BEFORE}    pa::mlp::layerForward<${K}, ${N}, ${S}, R, T, ${TM}, ${V}, ${KS}, ${ACT}, ${HASBIAS}, ${KEEP}>(sm + ${IN}, sm + ${WOFF}, ${BIAS}, ${KEEPTO}, ${OUT}, row0 * ${N}, rows);
${AFTER})";

// Rows [ROW0, ROW0 + ROWS) of a [batch, WIDTH] tensor into shared memory at OFF (cp.async).
inline constexpr const char* kMlpCopyRows = "    pa::mlp::copyAsync<T>(sm + ${OFF}, ${SRC} + (${ROW0}) * ${WIDTH}, (${ROWS}) * ${WIDTH});\n";
// A layer's weights [K, N] into rows of stride S at OFF.
inline constexpr const char* kMlpCopyWeights = "    pa::mlp::copyWeights<${K}, ${N}, ${S}, T>(sm + ${OFF}, ${W});\n";
// A bias [N] at OFF.
inline constexpr const char* kMlpCopyBias = "    pa::mlp::copyAsync<T>(sm + ${OFF}, ${B}, ${N});\n";
inline constexpr const char* kMlpCommit = "    pa::mlp::commit();\n";
// Wait until at most COUNT of this thread's newest copy groups are in flight.
inline constexpr const char* kMlpWait = "    pa::mlp::waitGroups<${COUNT}>();\n";
// The resident kernels' wait for the tile's own rows: the first tile's came with the prologue's
// first group (COUNT groups after it), a later tile's are the newest group.
inline constexpr const char* kMlpWaitTile = "    if (first) pa::mlp::waitGroups<${COUNT}>(); else pa::mlp::waitGroups<0>();\n";
inline constexpr const char* kMlpBarrier = "    __syncthreads();\n";
// The resident forward's prefetch of the next tile's rows (a group of its own, empty past the end).
inline constexpr const char* kMlpPrefetchRows = R"(    {
      const long long next = tile + gridDim.x;
      pa::mlp::copyAsync<T>(sm + ${OFF}, ${SRC} + next * R * ${WIDTH}, (int)max(0LL, min((long long)R, batch - next * R)) * ${WIDTH});
      pa::mlp::commit();
    }
)";

// fused-mlp-grad and fused-mlp-train: block-strided tiles of R rows (each block the same tiles
// on every run). Per tile ${TOP} (fused-mlp-grad: the tile's inputs, then dz of the last layer
// from dy and y; fused-mlp-train: x's and the targets' rows, the forward, kept in shared memory,
// and the last dz from the MSE gradient), then ${LAYERS}, one kMlpBackwardLayer per layer from
// the last down, each adding the tile's dW and db into the block's partial sums `part` (${P}
// floats) and making the next dz. Then ${LOSS} and ${REDUCTION} (kMlpReduction). ${SEED},
// ${LOSSDECL} and ${LOSS}: fused-mlp-train's (kMlpTrainSeed, ...), empty for fused-mlp-grad.
inline constexpr const char* kMlpBackward = R"(
#include "kernels/fused_mlp.cuh"
// On sm_90: clusters of ${G} blocks (${C} blocks, ${C} / ${G} clusters); elsewhere each block is its own cluster.
extern "C" __global__ void __launch_bounds__(${T}) ${CLUSTER}${NAME}(${PARAMS}) {
  pa::pdlBegin();
  extern __shared__ __align__(16) float pa_mlp_smem[];
  constexpr int R = ${R}, T = ${T}, G = PA_MLP_CLUSTERS ? ${G} : 1, NC = ${C} / G;
  constexpr long long P = ${P};
  float* const sm = pa_mlp_smem;
  float* const part = ${PART};
  const long long tiles = ${TILES}, batch = ${ROWS};
${SEED}  long long tile = blockIdx.x;
  int rows = (int)max(0LL, min((long long)R, batch - tile * R));
  bool first = true;
${LOSSDECL}${PROLOGUE}  for (; tile < tiles; tile += gridDim.x, first = false) {
    const long long row0 = tile * R;
    rows = (int)min((long long)R, batch - row0);
${TOP}${LAYERS}  }
  pa::mlp::waitGroups<0>();
  if (first)  // a block without rows adds zeros
    for (int e = threadIdx.x; e < P; e += T) part[e] = 0.0f;
${LOSS}${REDUCTION}}
)";

// The end of fused-mlp-grad and fused-mlp-train: the reduction of the ${C} blocks' partial sums
// (kernels/fused_mlp.cuh): ${LEVEL1} per gradient segment (this rank's share of the cluster's
// sum) and ${LEVEL2} (the last cluster's sum of the cluster slots). ${FENCE}: partial sums in the
// scratch are made visible device-wide before the cluster barrier. ${AFTERWAIT}: what else runs
// once every member's shared memory is complete.
inline constexpr const char* kMlpReduction = R"(${FENCE}  __syncthreads();
  pa::mlp::clusterArrive();
  pa::mlp::clusterWait();  // every member's partial sums are complete
  const int rank = (int)(blockIdx.x % G);
${AFTERWAIT}  {
    const long long cluster = blockIdx.x / G;
    const float* member[G];
    for (int m = 0; m < G; ++m) member[m] = ${MEMBER};
    float* const slot = scratch + ${SLOTS} + cluster * P;
    (void)slot;
${LEVEL1}  }
  pa::mlp::clusterArrive();  // this block no longer reads the members' shared memory
  if (NC > 1 && pa::mlp::lastToArrive(reinterpret_cast<unsigned*>(scratch + ${COUNTERS}) + rank, NC)) {
    const float* const slots = scratch + ${SLOTS};
${LEVEL2}  }
  pa::mlp::clusterWait();  // nor does any other: the shared memory may go
)";

// fused-mlp-train's slots of kMlpBackward: the loss gradient's seed, the thread's sum of squared
// errors, and after the tiles each block's sum of them (kernels/fused_mlp.cuh blockSum), added in
// block order through the scratch by the last block to arrive where the grid is several clusters
// (one cluster: kMlpTrainClusterLoss, inside the reduction).
inline constexpr const char* kMlpTrainSeed = "  const float seed = in2[0];\n";
// With the session's Adam in the kernel (EmitOptions::adamInTrainNode): the step's scalars, read
// at the start, and the loss's copy into the session's ring (kMlpTrainLoss, kMlpTrainClusterLoss).
inline constexpr const char* kMlpTrainAdamDecl =
    "  const pa::adam::Hyper hyper = pa::adam::hyperOf(adam->step, adam->beta1, adam->beta2, adam->eps);\n";
inline constexpr const char* kMlpTrainRing = "      adam->ring[adam->step->lossSlot % adam->ringSize] = mean;\n";
inline constexpr const char* kMlpTrainLossDecl = "  double loss = 0.0;\n";
inline constexpr const char* kMlpTrainLoss = R"(  __shared__ double blockLoss;
  {
    const double sum = pa::mlp::blockSum<T>(loss);
    if (threadIdx.x == 0) blockLoss = sum;
    if constexpr (NC > 1) {  // several clusters: through the scratch
      double* const sums = reinterpret_cast<double*>(scratch + ${LOSSSUMS});
      if (threadIdx.x == 0) sums[blockIdx.x] = sum;
      if (pa::mlp::lastToArrive(reinterpret_cast<unsigned*>(scratch + ${LOSSCOUNTER}), gridDim.x) && threadIdx.x == 0) {
        double total = 0.0;
        for (unsigned b = 0; b < gridDim.x; ++b) total += __ldcg(sums + b);
        const float mean = (float)(total / ${DENOM});
        out0[0] = mean;
${RING}      }
    }
  }
)";

// fused-mlp-train's loss where the grid is one cluster, once the members' shared memory is complete.
inline constexpr const char* kMlpTrainClusterLoss = R"(  if constexpr (NC == 1) {  // one cluster: rank 0 adds the members' losses from their shared memory
    if (rank == 0 && threadIdx.x == 0) {
      double total = 0.0;
      for (int m = 0; m < G; ++m) total += *pa::mlp::memberShared(&blockLoss, m);
      const float mean = (float)(total / ${DENOM});
      out0[0] = mean;
${RING}    }
  }
)";

// fused-mlp-train's tile inputs: x's rows and the targets' (after the first tile, once the
// previous tile is done with the buffers), waited for with the weights' group on the first tile.
inline constexpr const char* kMlpTrainTop = R"(    if (!first) __syncthreads();
${COPIES}    pa::mlp::commit();
    pa::mlp::waitGroups<0>();
    __syncthreads();
)";

// One layer of fused-mlp-train's forward: its output kept in shared memory at KEEPTO (the next
// layer's input, or y) and stored to OUT (y), or nowhere (pa::mlp::Discard).
inline constexpr const char* kMlpTrainForwardLayer = R"(    // forward layer ${LAYER}: [${K}] -> [${N}], ${ACTNAME}${BIASNOTE}; ${TILING}
    pa::mlp::layerForward<${K}, ${N}, ${S}, R, T, ${TM}, ${V}, ${KS}, ${ACT}, ${HASBIAS}, true>(sm + ${IN}, sm + ${WOFF}, ${BIAS}, sm + ${KEEPTO}, ${OUT}, row0 * ${N}, rows);
    __syncthreads();
)";

// fused-mlp-train's last dz: the MSE gradient of y against the targets, times act'(y).
inline constexpr const char* kMlpTrainOutputGrad = R"(    pa::mlp::mseOutputGrad<T, ${ACT}>(sm + ${Y}, sm + ${TGT}, sm + ${DZ}, rows * ${N}, ${SCALE}, seed, loss);
)";

// The resident backward's tile inputs after the first: the previous tile is done with the buffers.
inline constexpr const char* kMlpLaterTileCopies = R"(    if (!first) {
      __syncthreads();
${COPIES}      pa::mlp::commit();
    }
)";

// dz of the last layer from the tile's dy and y.
inline constexpr const char* kMlpOutputGrad =
    "    pa::mlp::outputGrad<T, ${ACT}>(sm + ${DY}, sm + ${Y}, sm + ${DZ}, rows * ${N});\n";

// One backward layer: ${BEFORE} (its copies, waits and barrier), the tile's dW and db into the
// block's partial sums, then ${DXSTEP} (dh = dz·Wᵀ as the next dz, or dx).
inline constexpr const char* kMlpBackwardLayer = R"(    // layer ${LAYER}: [${K}] -> [${N}], ${ACTNAME}${BIASNOTE}; ${TILING}
${BEFORE}    pa::mlp::weightGrad<${K}, ${N}, T, ${TK}, ${VW}, ${HASBIAS}>(sm + ${H}, sm + ${DZ}, rows, part + ${WOFF}, part + ${BOFF}, first);
${DXSTEP})";

// dh = dz·Wᵀ: the lower layer's dz (Lower its activation) into shared NEXT, or dx (Lower -1, into ${DX}).
inline constexpr const char* kMlpInputGrad =
    R"(    pa::mlp::inputGrad<${K}, ${N}, ${S}, R, T, ${TM}, ${V}, ${NS}, ${LOWER}>(sm + ${DZ}, sm + ${WOFF}, sm + ${H}, ${NEXT}, ${DX}, row0 * ${K}, rows);
)";

// Level 1 for one gradient segment (COUNT floats at OFF in a partial sum): this rank's share
// summed over the cluster's members, into the gradient OUT when there is one cluster, else into
// the cluster's slot.
inline constexpr const char* kMlpSumMembers = R"(    if constexpr (NC == 1) pa::mlp::sumMembers<T, G, ${SHARED}>(member, ${OFF}, ${COUNT}, rank, ${OUT}, 0);
    else pa::mlp::sumMembers<T, G, ${SHARED}>(member, ${OFF}, ${COUNT}, rank, slot, ${OFF});
)";
// Level 2 for one segment: this rank's share of the cluster slots, added in cluster order.
inline constexpr const char* kMlpSumSlots = "    pa::mlp::sumSlots<T, G, NC, P>(slots, ${OFF}, ${COUNT}, rank, ${OUT});\n";

}  // namespace pa::codegen::templates
