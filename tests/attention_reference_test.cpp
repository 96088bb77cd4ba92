// CPU checks of the float64 attention reference: gradients by finite differences, mask edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/attention_reference.h"
#include "runtime/cuda/cuda_driver.h"

namespace pa {
namespace {

std::vector<double> randomVec(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = nd(rng);
  return v;
}

// L = sum(O * W) for a fixed random W, so dL/dO = W.
double loss(const AttentionReferenceProblem& pr, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& s, const std::vector<double>& w) {
  const auto f = attentionForwardReference(pr, q, k, v, s);
  double l = 0;
  for (size_t i = 0; i < w.size(); ++i) l += f.o[i] * w[i];
  return l;
}

TEST(AttentionReference, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(1234);
  AttentionReferenceProblem pr;
  pr.batch = 2, pr.heads = 4, pr.kvHeads = 2, pr.qLen = 5, pr.kLen = 7, pr.headDim = 8;
  pr.mask.causal = 1, pr.mask.alignBottomRight = 1, pr.mask.windowLeft = 3, pr.mask.sinks = 1;
  pr.sinkLogits = true;
  auto q = randomVec((size_t)pr.batch * pr.heads * pr.qLen * pr.headDim, rng);
  auto k = randomVec((size_t)pr.batch * pr.kvHeads * pr.kLen * pr.headDim, rng);
  auto v = randomVec(k.size(), rng);
  auto s = randomVec(pr.heads, rng);
  auto w = randomVec(q.size(), rng);
  const auto g = attentionBackwardReference(pr, q, k, v, s, w);
  const double eps = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); i += 3) {
      const double keep = x[i];
      x[i] = keep + eps;
      const double lp = loss(pr, q, k, v, s, w);
      x[i] = keep - eps;
      const double lm = loss(pr, q, k, v, s, w);
      x[i] = keep;
      EXPECT_NEAR((lp - lm) / (2 * eps), grad[i], 1e-6) << name << "[" << i << "]";
    }
  };
  check(q, g.dQ, "dQ");
  check(k, g.dK, "dK");
  check(v, g.dV, "dV");
  check(s, g.dSinkLogits, "dSink");
}

TEST(AttentionReference, FullyMaskedRowIsZeroWithMinusInfLse) {
  AttentionReferenceProblem pr;
  pr.qLen = 4, pr.kLen = 2, pr.headDim = 8;
  pr.mask.causal = 1, pr.mask.alignBottomRight = 1;  // rows 0 and 1 see no key
  std::mt19937 rng(7);
  auto q = randomVec(pr.qLen * 8, rng), k = randomVec(pr.kLen * 8, rng), v = randomVec(pr.kLen * 8, rng);
  const auto f = attentionForwardReference(pr, q, k, v, {});
  EXPECT_TRUE(std::isinf(f.lse[0]) && f.lse[0] < 0);
  EXPECT_TRUE(std::isinf(f.lse[1]) && f.lse[1] < 0);
  EXPECT_TRUE(std::isfinite(f.lse[2]));
  for (int d = 0; d < 8; ++d) EXPECT_EQ(f.o[d], 0.0);
  const auto g = attentionBackwardReference(pr, q, k, v, {}, randomVec(q.size(), rng));
  for (int d = 0; d < 16; ++d) EXPECT_EQ(g.dQ[d], 0.0);
}

TEST(CudaDriver, ReportsAbsenceWithoutThrowing) {
  const cuda::Driver& drv = cuda::Driver::instance();
  if (drv.available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_NE(drv.unavailableReason().find("no CUDA device"), std::string::npos) << drv.unavailableReason();
}

}  // namespace
}  // namespace pa
