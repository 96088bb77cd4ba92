// Data-parallel training on the CPU (README "Data-parallel training"): `mpirun -np 2` runs against
// the one-process run on the same global batches, checkpoints and resumes across rank counts, and
// launches that must fail on every rank with one message. Skipped where mpirun is not installed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "frontend/checkpoint.h"
#include "tests/test_util.h"

namespace pa {
namespace {

namespace fs = std::filesystem;

fs::path tempDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("pa_dp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using test::readFile;

std::string example(const std::string& name) { return std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml"; }

// mpirun on PATH, or "".
std::string findMpirun() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && ::access((fs::path(dir) / "mpirun").c_str(), X_OK) == 0) return (fs::path(dir) / "mpirun").string();
  return "";
}

#define SKIP_WITHOUT_MPIRUN()                                                                          \
  const std::string mpirun = findMpirun();                                                              \
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"; \
  if (!fs::exists(fs::path(PA_TRAIN_BINARY).parent_path() / "libpa_mpi.so"))                            \
  GTEST_SKIP() << "train was built without MPI (no libpa_mpi.so beside it)"

// mpirun as root too. In the sanitizer build the ranks keep AddressSanitizer's and UBSan's checks
// but not LeakSanitizer's: Open MPI never frees MPI_Init's state, and its allocations arrive on
// one-frame stacks (its libraries keep no frame pointers) that no suppression can match. Leaks of
// our own code are checked by every other test of that build, which runs the same code in one
// process.
std::string mpiEnv() {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LSAN_OPTIONS=detect_leaks=0 ";
}

// Ranks on however many cores (--oversubscribe), one OpenMP thread each so that the ranks do not
// fight over the cores.
std::string launch(const std::string& mpirun, int ranks) {
  return mpiEnv() + "OMP_NUM_THREADS=1 " + mpirun + " --oversubscribe -np " + std::to_string(ranks) + " ";
}

struct Ran {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

Ran run(const std::string& cmd, const fs::path& dir) {
  const fs::path o = dir / "stdout", e = dir / "stderr";
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(("OMP_NUM_THREADS=1 " + cmd + " >" + o.string() + " 2>" + e.string()).c_str());
  Ran r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = readFile(o);
  r.err = readFile(e);
  return r;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The metrics CSV: every row's training loss and validation loss (-1 where none), by step.
struct Metrics {
  std::vector<double> loss, val;
  size_t lines = 0;
};
Metrics readMetrics(const fs::path& csv) {
  Metrics m;
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("step,loss,val_loss", 0), 0u) << csv;
  while (std::getline(in, line)) {
    ++m.lines;
    std::stringstream row(line);
    std::string step, loss, val;
    std::getline(row, step, ',');
    std::getline(row, loss, ',');
    std::getline(row, val, ',');
    EXPECT_EQ(std::stoll(step), static_cast<long long>(m.lines)) << "row " << m.lines << " of " << csv << ": " << line;
    m.loss.push_back(std::stod(loss));
    m.val.push_back(val.empty() ? -1.0 : std::stod(val));
  }
  return m;
}

double relDiff(double a, double b) { return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), 1e-30}); }

// The largest difference of two checkpoints' parameters, relative to each tensor's largest value.
double paramsDiff(const fs::path& a, const fs::path& b) {
  const Checkpoint ca = readCheckpoint(findCheckpoint(a.string(), "a"));
  const Checkpoint cb = readCheckpoint(findCheckpoint(b.string(), "b"));
  EXPECT_EQ(ca.state.params.size(), cb.state.params.size());
  double worst = 0;
  for (const auto& [name, va] : ca.state.params) {
    const std::vector<double>& vb = cb.state.params.at(name);
    EXPECT_EQ(va.size(), vb.size()) << name;
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
      scale = std::max(scale, std::fabs(va[i]));
      diff = std::max(diff, std::fabs(va[i] - vb[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

struct Case {
  const char* config;
  const char* precision;
  double lossTol, paramTol;
  const char* fuse = nullptr;  // compiler.fuse in place of the example's, when set
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.config << " " << c.precision; }

class DataParallelMatch : public ::testing::TestWithParam<Case> {};

// `mpirun -np 2` trains what one process trains on the same global batches: the same losses and
// validation losses step by step and the same final parameters (within the rounding of splitting
// the batch's sums in two), the parameters identical on both ranks after every step, and one
// writer of the metrics, the summary and the checkpoint.
TEST_P(DataParallelMatch, TwoRanksTrainAsOneProcess) {
  SKIP_WITHOUT_MPIRUN();
  const Case c = GetParam();
  const fs::path dir = tempDir(std::string(c.config) + "_" + c.precision);
  const std::string fuse = c.fuse ? std::string(" --set 'compiler.fuse=") + c.fuse + "'" : "";  // (quoted: [ ] glob)
  auto argsIn = [&](const std::string& precision) {
    return " -c " + example(c.config) + " --device cpu --progress none --steps 50 --set precision=" + precision +
           " --set train.log_every=10" + fuse;
  };
  // One process in `precision`, its metrics and checkpoint under dir / `name`.
  auto runOne = [&](const std::string& precision, const std::string& name) {
    return run(std::string(PA_TRAIN_BINARY) + argsIn(precision) + " --metrics " + (dir / (name + ".csv")).string() +
                   " --checkpoint-dir " + (dir / name).string(),
               dir);
  };
  const Ran one = runOne(c.precision, "one");
  ASSERT_EQ(one.code, 0) << one.err;
  const Ran two = run("PA_CHECK_REPLICAS=1 " + launch(mpirun, 2) + PA_TRAIN_BINARY + argsIn(c.precision) + " --metrics " +
                          (dir / "two.csv").string() + " --checkpoint-dir " + (dir / "two").string(),
                      dir);
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  EXPECT_EQ(count(two.out, "data parallel: 2 ranks"), 1u) << two.out;
  EXPECT_EQ(count(two.out, "done: 50 steps"), 1u) << two.out;
  EXPECT_EQ(count(two.out, "parameters identical on all 2 ranks at the end and after every step"), 1u) << two.out;
  const Metrics m1 = readMetrics(dir / "one.csv"), m2 = readMetrics(dir / "two.csv");
  ASSERT_EQ(m1.lines, 50u);
  ASSERT_EQ(m2.lines, 50u);  // one writer: a second would have doubled or interleaved the rows
  double worstLoss = 0, worstVal = 0;
  for (size_t i = 0; i < 50; ++i) {
    worstLoss = std::max(worstLoss, relDiff(m1.loss[i], m2.loss[i]));
    ASSERT_EQ(m1.val[i] < 0, m2.val[i] < 0) << "step " << i + 1;
    if (m1.val[i] >= 0) worstVal = std::max(worstVal, relDiff(m1.val[i], m2.val[i]));
  }
  // fp32: both runs round the same sums, differently (the batch's gradient split in two), and
  // each lies about as far from the exact trajectory as fp32's rounding moves it: the one-process
  // run in fp64 against fp32 measures that distance d, and the two fp32 runs must lie within 2d
  // of each other (and never needs less than the case's floor). A fixed bar does not hold across
  // machines: the gap grows as the loss falls and follows BLAS's kernels (sine_attention: 4e-7 on
  // one machine, 3.2e-6 on another where d was 3.5e-6).
  double lossTol = c.lossTol, valTol = c.lossTol, paramTol = c.paramTol;
  if (std::string(c.precision) == "fp32") {
    const Ran ref = runOne("fp64", "ref");
    ASSERT_EQ(ref.code, 0) << ref.err;
    const Metrics r = readMetrics(dir / "ref.csv");
    ASSERT_EQ(r.lines, 50u);
    double refLoss = 0, refVal = 0;
    for (size_t i = 0; i < 50; ++i) {
      refLoss = std::max(refLoss, relDiff(m1.loss[i], r.loss[i]));
      if (m1.val[i] >= 0 && r.val[i] >= 0) refVal = std::max(refVal, relDiff(m1.val[i], r.val[i]));
    }
    lossTol = std::max(lossTol, 2 * refLoss);
    valTol = std::max(valTol, 2 * refVal);
    paramTol = std::max(paramTol, 2 * paramsDiff(dir / "one", dir / "ref"));
  }
  EXPECT_LE(worstLoss, lossTol);
  EXPECT_LE(worstVal, valTol);
  EXPECT_LE(paramsDiff(dir / "one", dir / "two"), paramTol);
  size_t checkpoints = 0;
  for (const auto& e : fs::directory_iterator(dir / "two")) checkpoints += e.is_directory();
  EXPECT_EQ(checkpoints, 1u);
  std::printf("%s %s: 2 ranks against 1 process over 50 steps: loss max rel diff %.3g (bar %.3g), validation %.3g (%.3g), "
              "parameters %.3g (%.3g)\n",
              c.config, c.precision, worstLoss, lossTol, worstVal, valTol, paramsDiff(dir / "one", dir / "two"), paramTol);
  fs::remove_all(dir);
}

// The floors: fp32 1e-6 on the losses, 1e-5 on the parameters (raised to twice fp32's own distance
// from fp64 where that is larger: the test above); fp64 ~1e-15 measured, 1e-12 asked.
INSTANTIATE_TEST_SUITE_P(Configs, DataParallelMatch,
                         // fp32 sine_attention on the unpacked projections, whose bar this is: with
                         // the example's packed ones (qkv) the runs agree to the step-1 rounding
                         // (8e-8) but the loss falls to 0.016 by step 50, where a 3e-8 gap is
                         // 1.8e-6 relative (eighth session); fp64 checks the packed path exactly.
                         ::testing::Values(Case{"sine_mlp", "fp32", 1e-6, 1e-5},
                                           Case{"sine_attention", "fp32", 1e-6, 1e-5, "[linear,attention,elementwise]"},
                                           Case{"sine_mlp", "fp64", 1e-12, 1e-12},
                                           Case{"sine_attention", "fp64", 1e-12, 1e-12}),
                         [](const auto& info) { return std::string(info.param.config) + "_" + info.param.precision; });

// A two-rank checkpoint resumes bit for bit at two ranks, and at one rank (one process) within
// the rounding of the split batch.
TEST(DataParallel, CheckpointsResumeAtTheSameOrAnotherRankCount) {
  SKIP_WITHOUT_MPIRUN();
  const fs::path dir = tempDir("resume");
  const std::string args = " -c " + example("sine_mlp") + " --device cpu --progress none --set train.log_every=10";
  auto two = [&](const std::string& extra) {
    const Ran r = run(launch(mpirun, 2) + PA_TRAIN_BINARY + args + extra, dir);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
  };
  two(" --steps 50 --checkpoint-dir " + (dir / "whole").string());
  two(" --steps 30 --checkpoint-dir " + (dir / "cut").string());
  fs::copy(dir / "cut", dir / "cut1", fs::copy_options::recursive);
  two(" --steps 50 --resume " + (dir / "cut").string());
  EXPECT_EQ(paramsDiff(dir / "whole", dir / "cut"), 0.0);
  const Ran one = run(std::string(PA_TRAIN_BINARY) + args + " --steps 50 --resume " + (dir / "cut1").string(), dir);
  ASSERT_EQ(one.code, 0) << one.err;
  const double d = paramsDiff(dir / "whole", dir / "cut1");
  EXPECT_GT(d, 0.0);  // the same parameters at one rank would mean the split was not taken
  EXPECT_LE(d, 1e-5);
  fs::remove_all(dir);
}

// Launches that cannot work stop on every rank with the same message and exit 2, at once.
TEST(DataParallel, BadLaunchesFailOnEveryRankWithOneMessage) {
  SKIP_WITHOUT_MPIRUN();
  const fs::path dir = tempDir("bad");
  const std::string base = std::string(PA_TRAIN_BINARY) + " -c " + example("sine_mlp") + " --device cpu --steps 5";
  Ran r = run(launch(mpirun, 2) + base + " --set train.batch_size=63", dir);
  EXPECT_EQ(r.code, 2) << r.err;
  const std::string split = "train.batch_size: 63 (the global batch) does not split evenly over 2 ranks";
  EXPECT_EQ(count(r.err, split), 2u) << r.err;
  EXPECT_LT(r.seconds, 30.0);
  // MPMD: the second rank gets another learning rate.
  r = run(mpiEnv() + mpirun + " --oversubscribe -np 1 " + base +
              " : -np 1 " + base + " --set train.optimizer.lr=0.002",
          dir);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count(r.err, "error: the ranks disagree on the run"), 2u) << r.err;
  EXPECT_EQ(count(r.err, "lr: 0.002"), 2u) << r.err;
  EXPECT_LT(r.seconds, 30.0);
  // A mistake on one rank only (its config file is missing): every rank stops with its message.
  r = run(mpiEnv() + mpirun + " --oversubscribe -np 1 " + base +
              " : -np 1 " + PA_TRAIN_BINARY + " -c " + (dir / "missing.yaml").string() + " --device cpu --steps 5",
          dir);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count(r.err, "missing.yaml"), 2u) << r.err;
  EXPECT_EQ(count(r.err, "rank 1 of 2 failed"), 1u) << r.err;
  EXPECT_LT(r.seconds, 30.0);
  fs::remove_all(dir);
}

// Several ranks announced by the launcher's environment but no MPI to join them: a clear refusal,
// exit 2 (needs no mpirun).
TEST(DataParallel, LaunchWithoutMpiIsRefused) {
  const fs::path dir = tempDir("nompi");
  const Ran r = run("OMPI_COMM_WORLD_SIZE=2 PA_MPI_PLUGIN=" + (dir / "none.so").string() + " " + PA_TRAIN_BINARY + " -c " +
                        example("sine_mlp") + " --device cpu --steps 1",
                    dir);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("launched as one of 2 ranks (OMPI_COMM_WORLD_SIZE=2)"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// --distributed with one process takes the data-parallel path and trains exactly as without it.
TEST(DataParallel, OneRankDistributedEqualsThePlainRun) {
  const fs::path dir = tempDir("one");
  const std::string base = std::string(PA_TRAIN_BINARY) + " -c " + example("sine_attention") +
                           " --device cpu --progress none --steps 20 --set train.log_every=5 --metrics ";
  const Ran plain = run(base + (dir / "plain.csv").string(), dir);
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Ran dp = run(base + (dir / "dp.csv").string() + " --distributed", dir);
  ASSERT_EQ(dp.code, 0) << dp.err;
  EXPECT_NE(dp.out.find("data parallel: 1 rank (single process)"), std::string::npos) << dp.out;
  const Metrics a = readMetrics(dir / "plain.csv"), b = readMetrics(dir / "dp.csv");
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.val, b.val);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pa
