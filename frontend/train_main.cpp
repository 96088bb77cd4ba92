// `train`: the command-line entry point. User mistakes exit 2 with one clear message.
#include <CLI/CLI.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>

#include "common/errors.h"
#include "frontend/checkpoint.h"
#include "frontend/compare.h"
#include "frontend/config.h"
#include "frontend/distributed.h"
#include "frontend/trainer.h"

namespace {

namespace fs = std::filesystem;

// --steps N: a count, with a message for people (CLI11's own check prints the range of a double).
int64_t parseSteps(const std::string& text) {
  int64_t v = 0;
  if (!pa::parseCount(text, v)) {
    const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    throw pa::UserError("--steps " + text + ": expected a whole number of steps, 0 or more" +
                        (digits ? " and at most " + std::to_string(INT64_MAX) : ""));
  }
  return v;
}

// The output folders and files are checked before the (possibly long) compile, so that a typo
// there fails at once and names its flag (or key). Returns why `dir` cannot take output, or "".
std::string outputDirProblem(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) return "is a file; expected a folder";
  fs::create_directories(dir, ec);
  if (ec) return "cannot create the folder: " + ec.message();
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return std::string("cannot write in the folder: ") + std::strerror(errno);
  return "";
}

void checkOutputDir(const std::string& flag, const std::string& dir) {
  if (dir.empty()) return;
  const std::string why = outputDirProblem(dir);
  if (!why.empty()) throw pa::UserError(flag + " " + dir + ": " + why);
}

void checkOutputFile(const std::string& flag, const std::string& file) {
  if (file.empty()) return;
  const std::string what = flag + " " + file;
  std::error_code ec;
  if (fs::is_directory(file, ec)) throw pa::UserError(what + ": is a folder; expected a file name");
  const fs::path parent = fs::path(file).has_parent_path() ? fs::path(file).parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) throw pa::UserError(what + ": the folder " + parent.string() + " does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0 || (fs::exists(file, ec) && ::access(file.c_str(), W_OK) != 0))
    throw pa::UserError(what + ": cannot write the file: " + std::strerror(errno));
}

// --config, or with --resume and no --config the config the checkpoint holds.
pa::Config loadRunConfig(const std::string& path, const std::vector<std::string>& sets, const pa::RunOptions& opt) {
  if (!path.empty() || opt.resumeFrom.empty()) {
    if (path.empty()) throw pa::UserError("--config: required: the model's YAML file (or --resume a checkpoint)");
    return pa::loadConfig(path, sets);
  }
  const std::string model = (fs::path(pa::findCheckpoint(opt.resumeFrom, "--resume")) / pa::kModelFile).string();
  try {
    return pa::configFromWeights(pa::safetensors::readMetadata(model), model, sets, "--resume");
  } catch (const pa::safetensors::FormatError& e) {
    throw pa::UserError(std::string("--resume: ") + e.what());
  }
}

// --plot: the pictures are drawn by the Python module (python3 -m pureattention.plot, matplotlib),
// from the run's metrics file or the comparison's figures as JSON; this program draws nothing.
// The build tree's module (build/python, beside this program) is found without installing it.
// Runs python3 with `args` after `-m pureattention.plot`; returns its exit status (-1: not run).
int runPlotModule(const std::vector<std::string>& args) {
  std::error_code ec;
  const fs::path here = fs::read_symlink("/proc/self/exe", ec).parent_path();
  std::string pythonPath;
  if (!ec && fs::exists(here / "python" / "pureattention" / "plot.py", ec)) pythonPath = (here / "python").string();
  std::vector<std::string> argv = {"python3", "-m", "pureattention.plot"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (!pythonPath.empty()) {
      const char* old = std::getenv("PYTHONPATH");
      ::setenv("PYTHONPATH", (pythonPath + (old && *old ? ":" + std::string(old) : "")).c_str(), 1);
    }
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execvp("python3", cargv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// --plot FILE: a .png or .svg name in a writable folder, and a Python that can draw it; checked
// before compiling.
void checkPlot(const std::string& file) {
  if (file.empty()) return;
  const std::string ext = fs::path(file).extension().string();
  if (ext != ".png" && ext != ".svg") throw pa::UserError("--plot " + file + ": expected a .png or .svg file name");
  checkOutputFile("--plot", file);
  if (runPlotModule({"--check"}) != 0)
    throw pa::UserError("--plot " + file + ": python3 -m pureattention.plot cannot run: it needs the Python module "
                        "(pip install ., README \"Python\") and matplotlib");
}

// Draws `args` (--metrics FILE / --compare FILE.json) into `file`; removes `temporary` after.
void drawPlot(const std::string& file, const std::vector<std::string>& args, const std::string& temporary) {
  std::vector<std::string> all = args;
  all.push_back(file);
  const int status = runPlotModule(all);
  std::error_code ec;
  if (!temporary.empty()) fs::remove(temporary, ec);
  if (status != 0)
    throw std::runtime_error("--plot " + file + ": python3 -m pureattention.plot failed (exit " + std::to_string(status) + ")");
  std::printf("plot: %s\n", file.c_str());
}

// The figures of --compare as the plot module reads them (pureattention.plot.compare).
std::string writeCompareJson(const pa::Config& cfg, const pa::CompareResult& r) {
  auto side = [](const pa::TrainResult& t) {
    return nlohmann::json{{"loss", t.losses}, {"seconds_per_step", t.secondsPerStep}, {"nodes", t.trainNodes},
                          {"activation_bytes", t.activationBytes}, {"device", t.device}};
  };
  const nlohmann::json j = {{"name", cfg.name},        {"fused", side(r.fused)}, {"unfused", side(r.unfused)},
                            {"tolerance", r.tolerance}, {"agree", r.agree},       {"max_loss_rel_diff", r.maxLossRelDiff}};
  const std::string path = (fs::temp_directory_path() / ("pa-compare-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << j.dump();
  return path;
}

// Flags that make no sense together, or without another.
void checkFlagCombinations(const pa::RunOptions& opt, bool compare) {
  auto refuse = [](const std::string& a, const std::string& b) {
    throw pa::UserError(a + " cannot be combined with " + b);
  };
  if (!opt.resumeFrom.empty() && !opt.initFrom.empty())
    refuse("--resume", "--init-from (a resumed run continues the checkpoint's weights and optimizer state)");
  if (opt.initFromPartial && opt.initFrom.empty()) throw pa::UserError("--init-from-partial needs --init-from FILE");
  if (compare) {
    if (!opt.resumeFrom.empty()) refuse("--compare", "--resume (it trains from fresh or --init-from weights)");
    if (!opt.checkpointDir.empty()) refuse("--compare", "--checkpoint-dir (--compare writes no checkpoints)");
    if (!opt.dumpBatchesPath.empty()) refuse("--compare", "--dump-batches");
  }
}

// What every rank of a data-parallel run must agree on: the resolved config and the flags that
// change what a step computes (output paths may differ).
std::string jobDescription(const pa::Config& cfg, const pa::RunOptions& opt) {
  pa::Config planned = cfg;
  if (opt.steps >= 0) {
    planned.train.steps = opt.steps;
    planned.train.epochs = 0;
  }
  return pa::resolvedConfigYaml(planned) + "flags:\n  device: " + opt.device + "\n  no_fuse: " +
         (opt.noFuse ? "true" : "false") + "\n  init_from: " + opt.initFrom + "\n  resume: " + opt.resumeFrom + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PureAttention: train a model described in YAML (see README for every key)"};
  std::string configPath, progress = "auto", steps;
  std::vector<std::string> sets;
  pa::RunOptions opt;
  app.add_option("--config,-c", configPath,
                 "the model's YAML file (required, except with --resume: then the checkpoint's config is the default)");
  app.add_option("--set", sets, "override a config key: key.path=value (repeatable; list items by index)");
  app.add_option("--device", opt.device, "auto | cpu | cuda (overrides the config's device)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--steps", steps, "train this many steps (overrides train.steps and train.epochs)");
  app.add_option("--metrics", opt.metricsPath, "write per-step metrics to FILE (.csv, .jsonl or .json)");
  app.add_option("--dump-graph", opt.dumpGraphDir, "write the graph after each stage to DIR (.txt, .dot, .svg)");
  app.add_option("--dump-kernels", opt.dumpKernelsDir,
                 "write the CUDA source of every kernel of the training step to DIR (no GPU needed)");
  app.add_option("--progress", progress, "auto | bar | lines | none (auto: a bar on a terminal, lines otherwise)")
      ->check(CLI::IsMember({"auto", "bar", "lines", "none"}));
  app.add_flag("--verbose,-v", opt.verbose, "print each pass's statistics");
  app.add_option("--checkpoint-dir", opt.checkpointDir,
                 "save checkpoints under DIR (overrides train.checkpoint.dir): every train.checkpoint.every steps, "
                 "on Ctrl-C/SIGTERM and at the end");
  app.add_option("--resume", opt.resumeFrom,
                 "continue the checkpoint DIR|FILE names (a folder of checkpoints: its latest), bit for bit");
  app.add_option("--init-from", opt.initFrom,
                 "start from the weights of FILE.safetensors (graph parameter names and shapes), fresh optimizer state");
  app.add_flag("--init-from-partial", opt.initFromPartial,
               "with --init-from: load the tensors that match, start the others from the seed, and list them");
  app.add_option("--dump-batches", opt.dumpBatchesPath,
                 "write the data split and every step's training rows to FILE.safetensors at the end");
  std::string plotPath;
  app.add_option("--plot", plotPath,
                 "draw the run (with --compare: the comparison) into FILE.png|svg with the Python module (matplotlib)");
  bool compare = false, distributed = false;
  app.add_flag("--distributed", distributed,
               "take the data-parallel path as one process too: gradients averaged through the communicator (on "
               "the GPU an NCCL all-reduce inside the captured step); mpirun/srun launches of several ranks take it anyway");
  app.add_flag("--no-fuse", opt.noFuse, "train the primitive graph: leave the fusion passes out");
  app.add_flag("--compare", compare,
               "train the fused and the unfused graph side by side from the same weights; exit 1 if they disagree");
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
  opt.progress = progress == "bar" ? pa::ProgressMode::Bar
                 : progress == "lines" ? pa::ProgressMode::Lines
                 : progress == "none" ? pa::ProgressMode::Quiet
                                      : pa::ProgressMode::Auto;
  // Data parallel: every rank prints its own error; until the ranks have met, a rank that failed
  // tells the others at the rendezvous, so that all of them stop with its message.
  std::shared_ptr<pa::Communicator> comm;
  bool met = false;
  int code = 0;
  std::string failure;
  try {
    if (!steps.empty()) opt.steps = parseSteps(steps);
    checkFlagCombinations(opt, compare);
    comm = pa::startCommunicator(distributed);
    opt.comm = comm;
    if (comm && compare)
      throw pa::UserError("--compare trains in one process: run it without mpirun/srun and without --distributed");
    const pa::Config cfg = loadRunConfig(configPath, sets, opt);
    // Rank 0 alone writes; the other ranks neither check nor create its outputs.
    if (pa::leadsRun(opt)) {
      checkOutputFile("--metrics", opt.metricsPath);
      checkOutputFile("--dump-batches", opt.dumpBatchesPath);
      checkOutputDir("--dump-graph", opt.dumpGraphDir);
      checkOutputDir("--dump-kernels", opt.dumpKernelsDir);
      checkOutputDir("--checkpoint-dir", opt.checkpointDir);
      checkPlot(plotPath);
      if (opt.checkpointDir.empty() && !cfg.train.checkpoint.dir.empty() && !compare) {
        const std::string why = outputDirProblem(cfg.train.checkpoint.dir);
        if (!why.empty()) cfg.where.fail("train.checkpoint.dir", cfg.train.checkpoint.dir + ": " + why);
      }
    } else {
      opt.dumpGraphDir.clear();
      opt.dumpKernelsDir.clear();
      plotPath.clear();
    }
    if (comm && comm->size() > 1) {
      met = true;
      pa::meetRanks(*comm, jobDescription(cfg, opt), "");
    }
    if (compare) {
      const pa::CompareResult r = pa::compareFusedUnfused(cfg, opt, stdout);
      if (!plotPath.empty()) {
        const std::string json = writeCompareJson(cfg, r);
        drawPlot(plotPath, {"--compare", json, "--title", cfg.name + ": fused against unfused"}, json);
      }
      return r.agree ? 0 : 1;  // one process (refused above with a communicator)
    }
    opt.catchInterrupts = true;
    // --plot draws from the metrics file: --metrics, else a temporary one.
    std::string plotMetrics;
    if (!plotPath.empty() && opt.metricsPath.empty()) {
      plotMetrics = (fs::temp_directory_path() / ("pa-plot-" + std::to_string(::getpid()) + ".csv")).string();
      opt.metricsPath = plotMetrics;
    }
    const pa::TrainResult r = pa::train(cfg, opt);
    if (!plotPath.empty()) drawPlot(plotPath, {"--metrics", opt.metricsPath, "--title", cfg.name}, plotMetrics);
    if (r.interruptedBy) code = 128 + r.interruptedBy;  // the shell's convention: 130 for Ctrl-C
  } catch (const pa::UserError& e) {
    failure = e.what();
    code = 2;
  } catch (const std::bad_alloc&) {
    failure = pa::kOutOfHostMemory;
    code = 1;
  } catch (const std::exception& e) {
    failure = e.what();
    code = 1;
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "error: %s\n", failure.c_str());
    std::fflush(stderr);
    if (comm && comm->size() > 1 && !met) {
      try {
        pa::meetRanks(*comm, "", failure);
      } catch (const std::exception&) {  // this rank's message is printed already
      }
    }
  }
  std::fflush(stdout);
  return comm ? comm->finish(code, pa::rendezvousTimeout()) : code;
}
