// `predict`: the command-line entry point. User mistakes exit 2 with one clear message.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <exception>
#include <new>

#include "common/errors.h"
#include "frontend/predict.h"

int main(int argc, char** argv) {
  CLI::App app{"PureAttention: predict with trained weights (see README, \"Save, resume, predict\")"};
  pa::PredictOptions opt;
  app.add_option("--weights,-w", opt.weights,
                 "a safetensors file of the model's parameters, a checkpoint folder, or a folder of checkpoints (its latest)")
      ->required();
  app.add_option("--config,-c", opt.configPath,
                 "the model's YAML file (default: the config a checkpoint written by train holds)");
  app.add_option("--set", opt.sets, "override a config key: key.path=value (repeatable)");
  app.add_option("--input", opt.input,
                 "a CSV file with a header: the model's input values a row, optionally followed by the targets");
  app.add_option("--split", opt.split, "predict the config's own data instead: validation | train | all")
      ->check(CLI::IsMember({"validation", "train", "all"}));
  app.add_option("--output,-o", opt.output, "the CSV file of predictions to write (one row per input row, with a header)")
      ->required();
  app.add_option("--device", opt.device, "auto | cpu | cuda (overrides the config's device)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--batch", opt.batch, "rows per forward pass (default: train.batch_size)")->check(CLI::Range(1, 1 << 24));
  // A file size limit (ulimit -f) makes a write fail with EFBIG and a message, not kill the
  // process half way through a file.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    const pa::PredictResult r = pa::predict(opt);
    std::printf("predicted %lld rows on %s -> %s", static_cast<long long>(r.rows), r.device.c_str(), opt.output.c_str());
    if (r.mse >= 0) std::printf("; MSE %.6e", r.mse);
    std::printf("\n");
  } catch (const pa::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: %s\n", pa::kOutOfHostMemory);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
