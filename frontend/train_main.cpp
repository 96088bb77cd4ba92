// `train`: the command-line entry point. User mistakes exit 2 with one clear message.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "frontend/compare.h"
#include "frontend/config.h"
#include "frontend/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"PureAttention: train a model described in YAML (see README for every key)"};
  std::string configPath, progress = "auto";
  std::vector<std::string> sets;
  pa::RunOptions opt;
  app.add_option("--config,-c", configPath, "the model's YAML file")->required();
  app.add_option("--set", sets, "override a config key: key.path=value (repeatable; list items by index)");
  app.add_option("--device", opt.device, "auto | cpu | cuda (overrides the config's device)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--steps", opt.steps, "train this many steps (overrides train.steps and train.epochs)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", opt.metricsPath, "write per-step metrics to FILE (.csv, .jsonl or .json)");
  app.add_option("--dump-graph", opt.dumpGraphDir, "write the graph after each stage to DIR (.txt, .dot, .svg)");
  app.add_option("--dump-kernels", opt.dumpKernelsDir,
                 "write the CUDA source of every kernel of the training step to DIR (no GPU needed)");
  app.add_option("--progress", progress, "auto | bar | lines | none (auto: a bar on a terminal, lines otherwise)")
      ->check(CLI::IsMember({"auto", "bar", "lines", "none"}));
  app.add_flag("--verbose,-v", opt.verbose, "print each pass's statistics");
  bool compare = false;
  app.add_flag("--no-fuse", opt.noFuse, "train the primitive graph: leave the fusion passes out");
  app.add_flag("--compare", compare,
               "train the fused and the unfused graph side by side from the same weights; exit 1 if they disagree");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  opt.progress = progress == "bar" ? pa::ProgressMode::Bar
                 : progress == "lines" ? pa::ProgressMode::Lines
                 : progress == "none" ? pa::ProgressMode::Quiet
                                      : pa::ProgressMode::Auto;
  try {
    const pa::Config cfg = pa::loadConfig(configPath, sets);
    if (compare) return pa::compareFusedUnfused(cfg, opt, stdout).agree ? 0 : 1;
    opt.catchInterrupts = true;
    const pa::TrainResult r = pa::train(cfg, opt);
    if (r.interruptedBy) return 128 + r.interruptedBy;  // the shell's convention: 130 for Ctrl-C
  } catch (const pa::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
