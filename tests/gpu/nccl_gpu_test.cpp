// Data parallel on the GPU through NCCL with one rank (`--distributed`): the NCCL all-reduce of
// the gradients and the loss is captured in the step's CUDA graph and the run trains as the plain
// one. Skips without a device or without libnccl.so.2 (README "Data-parallel training").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "frontend/config.h"
#include "frontend/trainer.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda/nccl.h"

namespace pa {
namespace {

std::string sourceDir() {
  const char* env = std::getenv("PA_SOURCE_DIR");
  return env && *env ? env : PA_SOURCE_DIR;
}

#define PA_REQUIRE_GPU_AND_NCCL()                                                                 \
  if (!cuda::Driver::instance().available())                                                      \
    GTEST_SKIP() << "no CUDA device: " << cuda::Driver::instance().unavailableReason();            \
  if (!cuda::Nccl::instance().available())                                                        \
  GTEST_SKIP() << "no NCCL: " << cuda::Nccl::instance().unavailableReason()

struct Trained {
  TrainResult result;
  int launches = 0;
  bool graph = false;
};

Trained trainOnGpu(const Config& cfg, bool distributed) {
  RunOptions opt;
  opt.device = "cuda";
  opt.progress = ProgressMode::Quiet;
  opt.printSummary = false;
  if (distributed) opt.comm = std::make_shared<SingleProcessCommunicator>();
  PreparedRun run = prepareRun(cfg, opt);
  Trained t;
  t.result = trainPrepared(cfg, opt, run);
  t.launches = run.session->launchesPerStep();
  t.graph = run.session->replaysCudaGraph();
  return t;
}

class NcclOneRank : public ::testing::TestWithParam<const char*> {};

TEST_P(NcclOneRank, TrainsAsThePlainRunInsideTheCudaGraph) {
  PA_REQUIRE_GPU_AND_NCCL();
  const Config cfg = loadConfig(sourceDir() + "/configs/" + GetParam() + ".yaml", {"train.steps=40", "train.log_every=20"});
  const Trained plain = trainOnGpu(cfg, false);
  const Trained dp = trainOnGpu(cfg, true);
  ASSERT_EQ(plain.result.losses.size(), 40u);
  ASSERT_EQ(dp.result.losses.size(), 40u);
  EXPECT_NE(dp.result.device.find("NCCL"), std::string::npos) << dp.result.device;
  EXPECT_TRUE(dp.graph);
  // The all-reduce is part of the captured step: the graph has more nodes than the plain one's.
  EXPECT_GT(dp.launches, plain.launches);
  // The mean over one rank is the value itself: the same trajectory (allowing one rounding).
  double worst = 0;
  for (size_t i = 0; i < 40; ++i)
    worst = std::max(worst, std::fabs(plain.result.losses[i] - dp.result.losses[i]) /
                                std::max(std::fabs(plain.result.losses[i]), 1e-30));
  EXPECT_LE(worst, 1e-6);
  EXPECT_NEAR(plain.result.finalValidation, dp.result.finalValidation, 1e-6 * std::fabs(plain.result.finalValidation));
  std::printf("  %s: NCCL %s, one rank: %d graph nodes a step (plain %d), losses max rel diff %.3g over 40 steps, "
              "%.3f ms/step (plain %.3f)\n",
              GetParam(), cuda::Nccl::instance().version().c_str(), dp.launches, plain.launches, worst,
              dp.result.secondsPerStep * 1e3, plain.result.secondsPerStep * 1e3);
}

// sine_mlp and mlp_tiny: one fused-mlp-train node a step, whose Adam stays a kernel of its own
// under data parallelism (the gradients are averaged between the node and the step).
INSTANTIATE_TEST_SUITE_P(Configs, NcclOneRank, ::testing::Values("sine_attention", "attn_block", "sine_mlp", "mlp_tiny"));

}  // namespace
}  // namespace pa
