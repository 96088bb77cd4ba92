// Time per training step on the GPU (forward, MSE, backward, Adam), for bench/train_vs_torch.py.
// Usage: gpu_train_bench CONFIG.yaml [--set key=value]... [--steps N] [--reps R] [--no-cuda-graph] [--no-pdl]
//        [--no-flash-pdl] [--one-stream] [--side-max-gflop X] [--bias-grad-apart] [--no-adam-in-node] [--no-packed-copies] [--no-packed-grads] [--simt-gemm] [--fragment-epilogues] [--thread-stores]
//        [--cast-kernel] [--profile]
// (--profile: also print each node's time, slowest first, to stderr; --no-pdl: launch the step's
// kernels plain instead of as programmatic dependents on sm_90+; --no-flash-pdl: only the
// FlashAttention launcher's kernels plain; --one-stream: every node on the
// step's stream, none on the runner's second stream; --side-max-gflop X: the largest product the
// second stream takes, in GFLOP (0: any); --bias-grad-apart: a layer's weight-gradient product
// and its bias-gradient sum stay two nodes (no fuse-bias-grad); --no-adam-in-node: a step that is
// one fused-mlp-train node runs the Adam kernel after it instead of in it; --no-packed-copies:
// the concat / interleave kernels that pack fuse-qkv's and SwiGLU's weights (and fuse-qkv's biases) run each step
// instead of Adam writing the packed copies; --no-packed-grads: the slice / deinterleave kernels
// unpack those weights' gradients each step instead of Adam reading them in place; --simt-gemm: fp32
// products on the SIMT kernel where the device would run them on the FP64 tensor cores;
// --fragment-epilogues: every wgmma product's epilogue on the fragments in registers, none on the
// staged raw sums; --thread-stores: wgmma products store C by their threads, not by TMA;
// --cast-kernel: in bf16, the cast of the batch input runs as a kernel instead of in the batch
// gather; all for A/B runs)
// Prints one JSON object: the median over R repetitions of (wall time of N queued steps, from
// the first enqueue to the last loss read back) / N, after 10 warm-up steps (the first one runs
// eagerly and the second captures the CUDA graph). The host only waits at the end of each
// repetition, as in training, so host overhead counts where the device is faster than it.
// model_gflop is the step's model FLOPs (codegen/flops.h) and tflops that over the median time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/trainer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml [--set key=value]... [--steps N] [--reps R] [--no-cuda-graph] [--no-pdl] [--no-flash-pdl] [--one-stream] [--side-max-gflop X] [--bias-grad-apart] [--no-adam-in-node] "
                 "[--no-packed-copies] [--no-packed-grads] [--simt-gemm] [--fragment-epilogues] [--thread-stores] [--cast-kernel] [--profile]\n",
                 argv[0]);
    return 2;
  }
  std::vector<std::string> overrides;
  int64_t steps = 200;
  int reps = 5;
  bool profile = false;
  pa::RunOptions opt;
  opt.printSummary = false;
  opt.progress = pa::ProgressMode::Quiet;
  opt.device = "cuda";
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--set") && i + 1 < argc) overrides.push_back(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-cuda-graph")) opt.cudaGraph = false;
    else if (!std::strcmp(argv[i], "--no-pdl")) opt.pdl = false;
    else if (!std::strcmp(argv[i], "--no-flash-pdl")) opt.flashPdl = false;
    else if (!std::strcmp(argv[i], "--one-stream")) opt.sideStream = false;
    else if (!std::strcmp(argv[i], "--side-max-gflop") && i + 1 < argc) opt.sideStreamMaxGflop = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--bias-grad-apart")) opt.biasGradInProduct = false;
    else if (!std::strcmp(argv[i], "--no-adam-in-node")) opt.adamInTrainNode = false;
    else if (!std::strcmp(argv[i], "--no-packed-copies")) opt.packedWeightCopies = false;
    else if (!std::strcmp(argv[i], "--no-packed-grads")) opt.packedGradViews = false;
    else if (!std::strcmp(argv[i], "--simt-gemm")) opt.fp64Gemm = false;
    else if (!std::strcmp(argv[i], "--fragment-epilogues")) opt.stagedEpilogues = false;
    else if (!std::strcmp(argv[i], "--thread-stores")) opt.tmaStores = false;
    else if (!std::strcmp(argv[i], "--cast-kernel")) opt.castInGather = false;
    else if (!std::strcmp(argv[i], "--profile")) profile = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  try {
    const pa::Config cfg = pa::loadConfig(argv[1], overrides);
    opt.steps = 10 + steps * reps;
    std::unique_ptr<pa::Session> s = pa::makeSession(cfg, opt);
    int64_t step = 1;
    for (; step <= 10; ++step) s->enqueueStep(step);
    s->takeLosses();
    std::vector<double> ms;
    double lastLoss = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) s->enqueueStep(step++);
      const std::vector<double> losses = s->takeLosses();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / static_cast<double>(steps));
      lastLoss = losses.back();
    }
    if (profile) s->printProfile(stderr, 40);
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    std::printf("{\"config\": \"%s\", \"precision\": \"%s\", \"batch\": %lld, \"steps\": %lld, \"reps\": %d, "
                "\"ms_per_step\": %.5f, \"min_ms\": %.5f, \"max_ms\": %.5f, \"model_gflop\": %.4f, \"tflops\": %.3f, "
                "\"launches_per_step\": %d, \"side_stream_nodes\": %d, \"side_stream_forks\": %d, \"cuda_graph\": %s, \"pdl\": %s, "
                "\"activation_mib\": %.2f, \"last_loss\": %.6e, \"device\": \"%s\", \"gemm\": \"%s\"}\n",
                cfg.name.c_str(), pa::precisionName(cfg.precision), (long long)cfg.train.batchSize, (long long)steps, reps,
                sorted[sorted.size() / 2], sorted.front(), sorted.back(), s->result().stepFlops * 1e-9,
                s->result().stepFlops / (sorted[sorted.size() / 2] * 1e-3) * 1e-12, s->launchesPerStep(),
                s->deviceSummary() ? s->deviceSummary()->sideStreamNodes : 0,
                s->deviceSummary() ? s->deviceSummary()->sideStreamForks : 0,
                s->replaysCudaGraph() ? "true" : "false",
                s->deviceSummary() && s->deviceSummary()->programmaticLaunch ? "true" : "false", static_cast<double>(s->result().activationBytes) / (1 << 20),
                lastLoss, s->result().device.c_str(), s->result().gemm.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
    return 1;
  }
}
