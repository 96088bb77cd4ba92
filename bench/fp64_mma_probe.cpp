// Throughput probe for the fp64Mma flash attention path (FlashAttentionConfig::fp64Mma): how
// many FFMA, fp64 tensor-core FMAs (mma.sync m16n8k4 / m8n8k4 .f64) and fp32 <-> fp64 conversions
// an SM retires per clock, alone and with conversions mixed into the DMMA stream in the ratio the
// fp64Mma kernels use (about 3.3 conversions per m16n8k4, bench/RESULTS_flash.md). Each kernel
// runs one block per multiprocessor; every block times itself with clock64(), so the figures are
// per SM clock whatever the clock rate, beside the wall-clock rate from CUDA events.
//   fp64_mma_probe [--iters N] [--compile-only ARCH]
//     --compile-only: NVRTC-compiles the probes for ARCH (sm_80, sm_90) and exits (the CI check;
//     no GPU needed)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/nvrtc_compiler.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/cuda_driver.h"

namespace {

// One warp's work per loop iteration is written next to each kernel (in per-lane operations).
const char* kSource = R"(
__device__ __forceinline__ void dmma(double (&d)[4], double a0, double a1, double b0) {
#if __CUDA_ARCH__ >= 900
  asm volatile("{ mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3}; }"
               : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a0), "d"(a1), "d"(b0));
#else
  asm volatile("{ mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1}; }"
               : "+d"(d[0]), "+d"(d[1]) : "d"(a0), "d"(b0));
  asm volatile("{ mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1}; }"
               : "+d"(d[2]), "+d"(d[3]) : "d"(a1), "d"(b0));
#endif
}
__device__ __forceinline__ double up(float x) {
  double r;
  asm volatile("{ cvt.f64.f32 %0, %1; }" : "=d"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float down(double x) {
  float r;
  asm volatile("{ cvt.rn.f32.f64 %0, %1; }" : "=f"(r) : "d"(x));
  return r;
}
__device__ __forceinline__ void stamp(long long* cycles, long long t0) {
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

// 8 independent chains of m16n8k4: 8 x 512 FMA per warp.
extern "C" __global__ void probe_dmma(double* out, long long* cycles, int iters) {
  double acc[8][4];
  for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0;
  const double a0 = 1e-3 * threadIdx.x, a1 = a0 + 1.0, b0 = 2e-3 * threadIdx.x;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 8; ++i) dmma(acc[i], a0, a1, b0);
  stamp(cycles, t0);
  double s = 0.0;
  for (int i = 0; i < 8; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// 32 independent FFMA chains: 32 FMA per lane.
extern "C" __global__ void probe_ffma(double* out, long long* cycles, int iters) {
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = (float)i;
  const float a = 1e-3f * threadIdx.x, b = 0.999f;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = fmaf(acc[i], b, a);
  stamp(cycles, t0);
  float s = 0.f;
  for (int i = 0; i < 32; ++i) s += acc[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// 16 independent chains of fp32 -> fp64 -> fp32: 32 conversions per lane.
extern "C" __global__ void probe_cvt(double* out, long long* cycles, int iters) {
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = 1.5f * i + threadIdx.x;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = down(up(x[i]));
  stamp(cycles, t0);
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += x[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// The fp64Mma kernels' mix: per m16n8k4, its accumulator's round trip (4 + 4 conversions per 4
// m16n8k4, as MmaStep<F64Tag> does per k16 step) and ~1.3 operand conversions (here 1 of a
// fresh fp32 value per m16n8k4, a 4-element B slice every 4): 8 chains, 8 x 512 FMA and 8 x 3
// conversions per warp and iteration.
extern "C" __global__ void probe_mix(double* out, long long* cycles, int iters) {
  float c[8][4];
  for (int i = 0; i < 8; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
  const float fa = 1e-3f * threadIdx.x;
  const double a0 = up(fa), a1 = a0 + 1.0;
  float fb = 2e-3f * threadIdx.x;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      double d[4] = {up(c[i][0]), up(c[i][1]), up(c[i][2]), up(c[i][3])};
#pragma unroll
      for (int h = 0; h < 4; ++h) dmma(d, a0, a1, up(fb + (float)h));
#pragma unroll
      for (int e = 0; e < 4; ++e) c[i][e] = down(d[e]);
    }
    fb += 1.f;
  }
  stamp(cycles, t0);
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += c[i][0] + c[i][1] + c[i][2] + c[i][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
)";

struct Probe {
  const char* name;
  const char* unit;       // what one operation is
  double opsPerWarpIter;  // operations one warp retires per loop iteration
  int itersScale;         // divides --iters (keeps each probe near the same run time)
};

}  // namespace

int main(int argc, char** argv) {
  using namespace pa;
  int iters = 20000;
  std::string compileOnly;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--compile-only") && i + 1 < argc) {
      compileOnly = argv[++i];
    } else {
      std::fprintf(stderr, "usage: fp64_mma_probe [--iters N] [--compile-only ARCH]\n");
      return 2;
    }
  }
  try {
    if (!compileOnly.empty()) {
      codegen::CompileRequest req;
      req.kernelName = "fp64_mma_probe";
      req.source = kSource;
      req.arch = compileOnly;
      const codegen::CompileResult res = codegen::Nvrtc::instance().compile(req);
      std::printf("fp64_mma_probe: compiled for %s (%zu bytes of cubin)\n", compileOnly.c_str(), res.cubin.size());
      return res.cubin.empty() ? 1 : 0;
    }
    cuda::Device device(0);
    const cuda::DeviceInfo& info = device.info();
    codegen::CompileRequest req;
    req.kernelName = "fp64_mma_probe";
    req.source = kSource;
    req.arch = info.arch();
    const codegen::CompileResult res = codegen::Nvrtc::instance().compile(req);
    device.makeCurrent();
    cuda::CUmodule module = nullptr;
    PA_CU_CHECK(cuModuleLoadData(&module, res.cubin.data()));
    std::printf("# fp64_mma_probe on %s (%s, %d SMs): one block per SM, per-SM clocks from clock64()\n",
                info.name.c_str(), info.arch().c_str(), info.multiprocessors);
    std::printf("%-10s %-6s %-26s %14s %14s\n", "probe", "warps", "unit", "per SM clock", "wall Gop/s");
    const Probe probes[] = {{"probe_ffma", "FMA (fp32)", 32.0 * 32, 1},
                            {"probe_dmma", "FMA (fp64 tensor core)", 8.0 * 512, 4},
                            {"probe_cvt", "conversion f32<->f64", 32.0 * 32, 4},
                            {"probe_mix", "FMA (fp64 tensor core)", 8.0 * 4 * 512, 16}};
    const int sms = info.multiprocessors;
    cuda::DeviceBuffer out((size_t)sms * 1024 * sizeof(double)), cycles((size_t)sms * sizeof(long long));
    for (const Probe& pr : probes) {
      cuda::CUfunction fn = nullptr;
      PA_CU_CHECK(cuModuleGetFunction(&fn, module, pr.name));
      for (int warps : {4, 8, 16}) {
        int n = iters / pr.itersScale;
        cuda::CUdeviceptr o = out.ptr(), c = cycles.ptr();
        void* args[] = {&o, &c, &n};
        cuda::Event start(true), stop(true);
        std::vector<double> perClock, wall;
        // A block too large for the kernel's registers (DMMA kernels at 16 warps) is skipped.
        constexpr cuda::CUresult kOutOfResources = 701;  // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        const cuda::CUresult first = cuda::Driver::instance().api().cuLaunchKernel(
            fn, sms, 1, 1, 32 * warps, 1, 1, 0, nullptr, args, nullptr);
        if (first == kOutOfResources) {
          std::printf("%-10s %-6d %-26s %14s %14s\n", pr.name + 6, warps, pr.unit, "too many regs", "-");
          continue;
        }
        if (first != cuda::kCudaSuccess) cuda::throwCudaError(first, "cuLaunchKernel", __FILE__, __LINE__);
        for (int rep = 0; rep < 6; ++rep) {  // the first is a warm-up
          start.record(nullptr);
          PA_CU_CHECK(cuLaunchKernel(fn, sms, 1, 1, 32 * warps, 1, 1, 0, nullptr, args, nullptr));
          stop.record(nullptr);
          stop.synchronize();
          float ms = 0;
          PA_CU_CHECK(cuEventElapsedTime(&ms, start.get(), stop.get()));
          std::vector<long long> cyc(sms);
          cycles.download(cyc.data(), cyc.size() * sizeof(long long));
          const double ops = pr.opsPerWarpIter * warps * n;  // per block
          if (rep == 0) continue;
          perClock.push_back(ops / (double)*std::max_element(cyc.begin(), cyc.end()));
          wall.push_back(ops * sms / (ms * 1e-3) / 1e9);
        }
        std::sort(perClock.begin(), perClock.end());
        std::sort(wall.begin(), wall.end());
        std::printf("%-10s %-6d %-26s %14.1f %14.0f\n", pr.name + 6, warps, pr.unit, perClock[perClock.size() / 2],
                    wall[wall.size() / 2]);
      }
    }
    PA_CU_CHECK(cuModuleUnload(module));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp64_mma_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
