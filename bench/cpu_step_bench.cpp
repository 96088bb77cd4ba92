// Google Benchmark: CPU time of one training step (forward, backward, Adam) for every config.
// Run: ./build/bench/cpu_step_bench [--benchmark_filter=mlp_tiny]; report the median.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>

#include "frontend/config.h"
#include "frontend/trainer.h"

namespace {

void stepBenchmark(benchmark::State& state, const std::string& name) {
  const pa::Config cfg = pa::loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml", {});
  pa::RunOptions opt;
  opt.printSummary = false;
  opt.progress = pa::ProgressMode::Quiet;
  opt.device = "cpu";  // the GPU has its own benchmark (gpu_train_bench)
  std::unique_ptr<pa::Session> s = pa::makeSession(cfg, opt);
  int64_t step = 1;
  s->step(step++);  // warm-up: first-touch of every buffer
  for (auto _ : state) benchmark::DoNotOptimize(s->step(step++));
  state.counters["batch"] = static_cast<double>(cfg.train.batchSize);
  state.counters["params"] = static_cast<double>(s->result().parameterCount);
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* name : {"sine_mlp", "sine_attention", "function_mlp", "mlp_tiny", "mlp_wide", "attn_block"}) {
    auto* b = benchmark::RegisterBenchmark(name, stepBenchmark, std::string(name));
    b->Unit(benchmark::kMillisecond)->Repetitions(3)->ReportAggregatesOnly(true)->UseRealTime();
    // The two big models take ~0.5-1 s a step on two cores: a handful of steps is enough.
    if (std::string(name) == "mlp_wide" || std::string(name) == "attn_block") b->Iterations(4);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
