// Times the generated GEMM kernels (one-node MatMul / FusedLinear graphs, fp32, TF32 and bf16)
// with CUDA events around 20 queued launches (GPU time: the host's launch latency hidden; median
// of 30 such samples): the issue-6 square product, mlp_wide's and attn_block's forward, dX and dW
// GEMMs and tiny_gpt's SwiGLU projection; and the same nodes on the cuBLASLt provider (variant
// "cublaslt"). Writes a CSV that bench/gemm_vs_torch.py reads to put PyTorch's times beside ours.
//   gemm_bench [--csv FILE] [--sweep] [--sweep-splits S,...] [--precisions fp32,tf32,bf16] [--shapes NAME,...]
//     --shapes: only these shapes (the names in the first column, e.g. square_NN)
//     --sweep-splits: the sweep's K splits of weight gradients (default 2,4,8,16,32,64)
//     --sweep also times every tile variant and the config variants kept here until one wins
//     (STYLE.md 6), and TF32 and bf16 weight gradients on the wgmma kernel with every tile and
//     2-64 K splits. TF32 rows "mma.sync": the mma.sync kernel (where auto may pick the wgmma one);
//     "wgmma_bcopy" / "wgmma_bkernel": the wgmma kernel with a B stored N-major copied transposed
//     first / transposed by the product kernel as it loads it (EmitOptions::tf32BLoad).
//     fp32 products whose auto choice splits the last wave's tiles along K (a tail split,
//     EmitOptions::gemmTailSplits): "large_notail" without it, and with --sweep "large_tailS"
//     for S = 2 to 9.
//     fp32 on a device with full-rate FP64 (auto: the FP64 tensor-core kernel, EmitOptions::fp32Gemm):
//     "simt" is the SIMT kernel on its auto tiles (and tail split); --sweep adds FP64 config variants.
//     bf16: operands stored in bf16 as lower-bf16 stores them, outputs in bf16 except the
//     weight gradients (dW rows: fp32), the wgmma kernel on an sm_90a device.
//     wgmma products with an epilogue (FusedLinear, the _dXrelu / _dXgelu activation gradients):
//     "epi_fragments" / "epi_staged" with the functor forced onto the fragments / the staged raw
//     sums (EmitOptions::wgmmaEpilogue; "auto" picks by the epilogue).
//     bf16 products other than weight gradients on the wgmma kernel: "pingpong" (GemmTile::PingPong,
//     each consumer warpgroup a whole 128 × 128 tile, the two taking turns) and "medium" (the same
//     tile shared by both consumers).
//     Every wgmma product (bf16, TF32): "stores_threads" with C stored by the consumers' threads
//     where "auto" stores it by TMA (EmitOptions::wgmmaTmaStores). *_dWdb: the weight gradient
//     with the bias gradient (matmul-bias-grad; cuBLASLt's BGRAD epilogue).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cuda/cublaslt.h"
#include "tests/gpu/gemm_harness.h"

namespace pa {
namespace {

using codegen::GemmTile;
using gemmtest::GemmProblem;

struct Shape3 {
  std::string name;
  GemmProblem p;
  int64_t m, n, k;
};

std::vector<Shape3> shapes() {
  std::vector<Shape3> s;
  auto mm = [&](const std::string& name, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    s.push_back({name, gemmtest::matmulProblem(m, n, k, ta, tb), m, n, k});
  };
  auto fwd = [&](const std::string& name, int64_t m, int64_t n, int64_t k) {
    GemmProblem p;
    p.fused = true, p.act = "relu", p.bias = true;
    p.a = {m, k}, p.b = {k, n};
    s.push_back({name, p, m, n, k});
  };
  mm("square_NN", 8192, 4096, 4096, false, false);
  fwd("mlp1024_fwd", 8192, 1024, 1024);   // relu(X·W + b)
  mm("mlp1024_dX", 8192, 1024, 1024, false, true);  // dY·Wᵀ
  mm("mlp1024_dW", 1024, 1024, 8192, true, false);  // Xᵀ·dY
  auto dWdb = [&](const std::string& name, int64_t m, int64_t n, int64_t k) {  // Xᵀ·dY and dY's column sums (matmul-bias-grad)
    GemmProblem p = gemmtest::matmulProblem(m, n, k, true, false);
    p.biasGrad = "b";
    s.push_back({name, p, m, n, k});
  };
  dWdb("mlp1024_dWdb", 1024, 1024, 8192);
  dWdb("mlp256in_dWdb", 256, 1024, 8192);
  dWdb("mlp256out_dWdb", 1024, 256, 8192);
  auto actGrad = [&](const std::string& name, int64_t m, int64_t n, int64_t k, const char* act) {
    GemmProblem p = gemmtest::matmulProblem(m, n, k, false, true);
    p.gradAct = act;
    s.push_back({name, p, m, n, k});
  };
  actGrad("mlp1024_dXrelu", 8192, 1024, 1024, "relu");  // (dY·Wᵀ)·relu'(x): matmul-act-grad
  actGrad("mlp1024_dXgelu", 8192, 1024, 1024, "gelu");
  fwd("mlp256in_fwd", 8192, 1024, 256);
  mm("mlp256in_NN", 8192, 1024, 256, false, false);  // the same product without bias and ReLU
  mm("mlp256in_dX", 8192, 1024, 256, false, true);   // dY·Wᵀ of the 256 → 1024 layer's successor
  actGrad("mlp256in_dXrelu", 8192, 1024, 256, "relu");
  mm("mlp256in_dW", 256, 1024, 8192, true, false);
  fwd("mlp256out_fwd", 8192, 256, 1024);
  mm("mlp256out_dW", 1024, 256, 8192, true, false);
  // attn_block's projections (d 256 over 32 × 256 tokens): forward with bias, dX, dW.
  GemmProblem proj;
  proj.fused = true, proj.bias = true, proj.a = {8192, 256}, proj.b = {256, 256};
  s.push_back({"attn_proj_fwd", proj, 8192, 256, 256});
  mm("attn_proj_dX", 8192, 256, 256, false, true);
  mm("attn_proj_dW", 256, 256, 8192, true, false);
  dWdb("attn_proj_dWdb", 256, 256, 8192);
  dWdb("attn_qkv_dWdb", 256, 768, 8192);  // fuse-qkv's packed projection
  // tiny_gpt's SwiGLU projection (8 × 1024 tokens, 512 → 1536 as gate/up pairs, no bias): the
  // pair epilogue writes the pre-activations and silu(gate)·up.
  GemmProblem swiglu;
  swiglu.fused = true, swiglu.act = "swiglu", swiglu.a = {8192, 512}, swiglu.b = {512, 3072};
  s.push_back({"swiglu_fwd", swiglu, 8192, 3072, 512});
  return s;
}

cuda::Device& device() {
  static cuda::Device d(0);
  return d;
}

// GPU time: each of `reps` samples is kQueued launches queued between one pair of events (the
// host's launch latency hidden behind the kernels before it), divided by kQueued; the median
// sample, after `warmup` launches, rotating among the input sets.
constexpr int kQueued = 20;

template <class Launch>
double medianQueuedMs(Launch&& launch, int warmup, int reps) {
  cuda::Event start(true), stop(true);
  for (int i = 0; i < warmup; ++i) launch(i);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    start.record(nullptr);
    for (int q = 0; q < kQueued; ++q) launch(i * kQueued + q);
    stop.record(nullptr);
    stop.synchronize();
    float t = 0;
    PA_CU_CHECK(cuEventElapsedTime(&t, start.get(), stop.get()));
    ms.push_back(t / kQueued);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double timeNode(gemmtest::NodeOnGpu& node, const std::vector<std::vector<cuda::DeviceBuffer>>& sets, int warmup, int reps) {
  return medianQueuedMs([&](int i) { node.launchWith(sets[static_cast<size_t>(i) % sets.size()]); }, warmup, reps);
}

// The same node through the graph runner with cuBLASLt (compiler.gemm: cublaslt, its fastest
// heuristic candidate, epilogue included), timed the same way on one random input set.
double timeCublasLt(const Graph& g, NodeId id, bool tf32, int warmup, int reps) {
  CudaRunnerOptions opt;
  opt.tf32 = tf32;
  opt.gemm = GemmProvider::Cublaslt;
  CudaGraphRunner runner(g, device(), opt);
  const Node& node = g.node(id);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const std::vector<float> h = gemmtest::randomValues(numel(g.shape(node.inputs[i])), 7000u + i);
    runner.upload(node.inputs[i], h.data());
  }
  return medianQueuedMs([&](int) { runner.run(); }, warmup, reps);
}

// A bench-only variant: the emitted kernel with another config (and block/grid to match).
struct ConfigVariant {
  const char* precision;
  GemmTile tile;     // the emitted tile whose config is replaced
  const char* from;  // the config the emitter uses for that tile
  const char* to;
  const char* boundsFrom;
  const char* boundsTo;
  unsigned sharedBytes;  // the variant's dynamic shared memory; 0: the emitted kernel's
};

void replaceAll(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

int run(int argc, char** argv) {
  std::string csvPath = "gemm_bench.csv", precisions = "fp32,tf32,bf16", only, sweepSplits = "2,4,8,16,32,64";
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csvPath = argv[++i];
    else if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    else if (!std::strcmp(argv[i], "--precisions") && i + 1 < argc) precisions = argv[++i];
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--sweep-splits") && i + 1 < argc) sweepSplits = argv[++i];
    else {
      std::fprintf(stderr, "usage: gemm_bench [--csv FILE] [--sweep] [--sweep-splits S,...] [--precisions fp32,tf32,bf16] [--shapes NAME,...]\n");
      return 2;
    }
  }
  auto wanted = [&](const char* p) { return ("," + precisions + ",").find(std::string(",") + p + ",") != std::string::npos; };
  if (!cuda::Driver::instance().available()) {
    std::fprintf(stderr, "gemm_bench: no CUDA device: %s\n", cuda::Driver::instance().unavailableReason().c_str());
    return 1;
  }
  std::printf("device: %s (%s, %d SMs)\n", device().info().name.c_str(), device().info().arch().c_str(),
              device().info().multiprocessors);
  const cuda::CublasLt& lt = cuda::CublasLt::instance();
  if (lt.available())
    std::printf("cuBLASLt %zu from %s\n", lt.version(), lt.path().c_str());
  else
    std::printf("cuBLASLt unavailable (%s): no cublaslt rows\n", lt.unavailableReason().c_str());
  std::FILE* csv = std::fopen(csvPath.c_str(), "w");
  if (!csv) {
    std::fprintf(stderr, "gemm_bench: cannot write %s\n", csvPath.c_str());
    return 1;
  }
  std::fprintf(csv, "name,precision,variant,m,n,k,ta,tb,fused,ms,tflops\n");
  std::printf("%-15s %-5s %-26s %10s %9s\n", "shape", "prec", "variant", "ms", "TFLOP/s");
  // fp32 large tile yardsticks: the emitter's earlier config (BK = 8, chunks of 8 slices), and
  // slices twice as deep (BK = 32, chunks of 2: half the barriers; 66 KB of shared memory).
  const ConfigVariant configs[] = {
      {"fp32", GemmTile::Large, "SimtConfig<128, 128, 16, 8, 8, 4>", "SimtConfig<128, 128, 8, 8, 8, 8>", "(256, 1)", "(256, 1)",
       2 * 8 * (132 + 132) * 4},
      {"fp32", GemmTile::Large, "SimtConfig<128, 128, 16, 8, 8, 4>", "SimtConfig<128, 128, 32, 8, 8, 2>", "(256, 1)", "(256, 1)",
       2 * 32 * (132 + 132) * 4},
      // FP64 mma.sync (fp32 on full-rate FP64): 16 warps of 32 × 32 (120 registers against 224), and
      // four stages of BK = 8 (the same 40 KB).
      {"fp32", GemmTile::Large, "Tf32Config<128, 128, 16, 2, 4, 2>", "Tf32Config<128, 128, 16, 4, 4, 2>", "(256, 1)", "(512, 1)", 0},
      {"fp32", GemmTile::Large, "Tf32Config<128, 128, 16, 2, 4, 2>", "Tf32Config<128, 128, 8, 2, 4, 4>", "(256, 1)", "(256, 1)", 0},
      // wgmma: ring depth.
      {"bf16", GemmTile::Large, "WgmmaConfig<256, 2, 4>", "WgmmaConfig<256, 2, 3>", "(384, 1)", "(384, 1)", 3 * 384 * 128 + 2 * 64 * 256 + 1024},
      {"bf16", GemmTile::Medium, "WgmmaConfig<128, 2, 6>", "WgmmaConfig<128, 2, 4>", "(384, 1)", "(384, 1)", 4 * 256 * 128 + 2 * 64 * 256 + 1024},
  };

  for (const Shape3& s : shapes()) {
    if (!only.empty() && ("," + only + ",").find("," + s.name + ",") == std::string::npos) continue;
    const double flops = 2.0 * static_cast<double>(s.m) * s.n * s.k;
    auto reportMs = [&](double ms, const char* precision, const std::string& variant) {
      const double tflops = flops / (ms * 1e-3) / 1e12;
      std::printf("%-15s %-5s %-26s %10.4f %9.1f\n", s.name.c_str(), precision, variant.c_str(), ms, tflops);
      std::fprintf(csv, "%s,%s,%s,%lld,%lld,%lld,%d,%d,%d,%.5f,%.2f\n", s.name.c_str(), precision, variant.c_str(),
                   static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k), s.p.ta ? 1 : 0,
                   s.p.tb ? 1 : 0, s.p.fused ? 1 : 0, ms, tflops);
      std::fflush(stdout);
      std::fflush(csv);
    };
    for (const char* precision : {"fp32", "tf32", "bf16"}) {
      if (!wanted(precision)) continue;
      const bool tf32 = !std::strcmp(precision, "tf32"), bf16 = !std::strcmp(precision, "bf16");
      Graph g;
      const NodeId id = gemmtest::buildGraph(g, s.p);
      const bool weightGradient = s.name.find("_dW") != std::string::npos;
      if (bf16) gemmtest::storeOperandsInBf16(g, id, !weightGradient);
      const Node& node = g.node(id);
      // Fresh random non-zero inputs in their storage type; several sets when they would
      // otherwise stay in L2 (50 MB).
      size_t bytes = 0;
      for (ValueId v : node.inputs) bytes += static_cast<size_t>(numel(g.shape(v))) * sizeof(float);
      const int numSets = bytes < (size_t{200} << 20) ? 3 : 1;
      std::vector<std::vector<cuda::DeviceBuffer>> sets(static_cast<size_t>(numSets));
      for (int si = 0; si < numSets; ++si)
        for (size_t i = 0; i < node.inputs.size(); ++i) {
          std::vector<float> h = gemmtest::randomValues(numel(g.shape(node.inputs[i])), 1000u * si + i + 1);
          sets[static_cast<size_t>(si)].emplace_back(h.size() * sizeof(float));
          gemmtest::uploadStored(sets[static_cast<size_t>(si)].back(), h, g.value(node.inputs[i]).type.dtype);
        }
      auto report = [&](gemmtest::NodeOnGpu& gpu, const std::string& variant) { reportMs(timeNode(gpu, sets, 5, 30), precision, variant); };
      CudaRunnerOptions runnerOpt;
      runnerOpt.tf32 = tf32;
      const codegen::EmitOptions deviceOpt = CudaGraphRunner::emitOptionsFor(device(), runnerOpt);  // as training emits
      std::vector<std::pair<std::string, GemmTile>> tiles = {{"auto", GemmTile::Auto}};
      if (sweep) tiles.insert(tiles.end(), {{"large", GemmTile::Large}, {"medium", GemmTile::Medium}, {"small", GemmTile::Small}});
      // bf16 on the wgmma kernel: the ping-pong consumers beside their cooperative twin (medium).
      if (bf16 && deviceOpt.wgmma && !weightGradient) {
        if (!sweep) tiles.push_back({"medium", GemmTile::Medium});
        tiles.push_back({"pingpong", GemmTile::PingPong});
      }
      for (const auto& t : tiles) {
        codegen::EmitOptions opt = deviceOpt;
        opt.gemmTile = t.second;
        gemmtest::NodeOnGpu gpu(g, id, opt, device());
        report(gpu, t.first);
      }
      const bool autoTail = !tf32 && !bf16 &&
                            codegen::emitNode(g, id, deviceOpt).kernels[0].source.find("simtGemmTail<") != std::string::npos;
      if (autoTail) {  // fp32 with a tail split: the product without it, and (--sweep) with every split
        std::vector<int> tails = {1};
        if (sweep) tails.insert(tails.end(), {2, 3, 4, 5, 6, 7, 8, 9});
        for (int tail : tails) {
          codegen::EmitOptions opt = deviceOpt;
          opt.gemmTile = GemmTile::Large, opt.gemmTailSplits = tail;
          gemmtest::NodeOnGpu gpu(g, id, opt, device());
          report(gpu, tail == 1 ? "large_notail" : "large_tail" + std::to_string(tail));
        }
      }
      if (!tf32 && !bf16 && deviceOpt.fullRateFp64) {  // the SIMT kernel beside the FP64 one
        codegen::EmitOptions opt = deviceOpt;
        opt.fp32Gemm = codegen::Fp32Gemm::Simt;
        gemmtest::NodeOnGpu gpu(g, id, opt, device());
        report(gpu, "simt");
      }
      if (tf32 && deviceOpt.wgmma) {  // the TF32 mma.sync kernel beside the auto choice
        codegen::EmitOptions opt = deviceOpt;
        opt.wgmma = false;
        gemmtest::NodeOnGpu gpu(g, id, opt, device());
        report(gpu, "mma.sync");
      }
      if (tf32 && deviceOpt.wgmma && !s.p.tb) {  // an N-major B: copied first, or transposed as loaded
        for (const auto& b : {std::make_pair("wgmma_bcopy", codegen::Tf32BLoad::Copy),
                              std::make_pair("wgmma_bkernel", codegen::Tf32BLoad::InKernel)}) {
          codegen::EmitOptions opt = deviceOpt;
          opt.tf32BLoad = b.second;
          opt.gemmTile = GemmTile::Auto;
          gemmtest::NodeOnGpu gpu(g, id, opt, device());
          report(gpu, b.first);
        }
      }
      const bool epilogue = s.p.fused || !s.p.gradAct.empty();
      if (deviceOpt.wgmma && (bf16 || tf32) && epilogue) {  // the functor on the fragments and on the staged raw sums
        for (const auto& e : {std::make_pair("epi_fragments", codegen::WgmmaEpilogue::Fragments),
                              std::make_pair("epi_staged", codegen::WgmmaEpilogue::Staged)}) {
          codegen::EmitOptions opt = deviceOpt;
          opt.wgmmaEpilogue = e.second;
          gemmtest::NodeOnGpu gpu(g, id, opt, device());
          report(gpu, e.first);
        }
      }
      if (deviceOpt.wgmma && (bf16 || tf32)) {  // C stored by the consumers' threads instead of TMA
        codegen::EmitOptions opt = deviceOpt;
        opt.wgmmaTmaStores = false;
        gemmtest::NodeOnGpu gpu(g, id, opt, device());
        report(gpu, "stores_threads");
      }
      if (cuda::CublasLt::instance().available()) reportMs(timeCublasLt(g, id, tf32, 5, 30), precision, "cublaslt");
      if (!sweep) continue;
      if ((tf32 || bf16) && deviceOpt.wgmma && weightGradient) {  // the wgmma kernel on every tile and split
        for (const auto& t : {std::make_pair("large", GemmTile::Large), std::make_pair("medium", GemmTile::Medium),
                              std::make_pair("small", GemmTile::Small), std::make_pair("pingpong", GemmTile::PingPong)})
          for (int splits : {2, 4, 8, 16, 32, 64}) {
            if (("," + sweepSplits + ",").find("," + std::to_string(splits) + ",") == std::string::npos) continue;
            codegen::EmitOptions opt = deviceOpt;
            opt.gemmTile = t.second, opt.gemmSplits = splits;
            gemmtest::NodeOnGpu gpu(g, id, opt, device());
            report(gpu, std::string("wgmma_") + t.first + "_s" + std::to_string(splits));
          }
      }
      for (const ConfigVariant& cv : configs) {
        if (std::strcmp(cv.precision, precision) != 0) continue;
        codegen::EmitOptions opt = deviceOpt;
        opt.gemmTile = cv.tile;
        opt.gemmSplits = 1, opt.gemmTailSplits = 1;
        codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
        if (nk.kernels[0].source.find(cv.from) == std::string::npos) continue;
        replaceAll(nk.kernels[0].source, cv.from, cv.to);
        if (cv.sharedBytes) {  // (and in the fp32 kernel's check of it)
          replaceAll(nk.kernels[0].source, "kDynamicShared == " + std::to_string(nk.kernels[0].sharedBytes),
                     "kDynamicShared == " + std::to_string(cv.sharedBytes));
          nk.kernels[0].sharedBytes = cv.sharedBytes;
        }
        replaceAll(nk.kernels[0].source, std::string("__launch_bounds__") + cv.boundsFrom,
                   std::string("__launch_bounds__") + cv.boundsTo);
        nk.kernels[0].block[0] = static_cast<unsigned>(std::atoi(cv.boundsTo + 1));  // the block the bounds name
        gemmtest::NodeOnGpu gpu(g, id, std::move(nk), device());
        std::string label = std::string(cv.to) + cv.boundsTo;  // no commas or spaces: it is a CSV field
        replaceAll(label, ", ", "/");
        replaceAll(label, ",", "/");
        replaceAll(label, " ", "");
        report(gpu, label);
      }
    }
  }
  std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace pa

int main(int argc, char** argv) {
  try {
    return pa::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
}
