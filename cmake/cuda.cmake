# CUDA side of PureAttention: driver loader, NVRTC wrapper, embedded kernel templates, flash
# attention choice and launcher, their tests (labels `nvrtc`, `sweep` and `gpu`) and the benchmark library.
# Nothing here links libcuda or cudart: both NVRTC and the driver are dlopen'ed at run time.

set(PA_ROOT "${CMAKE_CURRENT_LIST_DIR}/..")
get_filename_component(PA_ROOT "${PA_ROOT}" ABSOLUTE)
option(PA_BUILD_FLASH_BENCH "Build the flash attention benchmark library (bench/)" ON)

if(PA_BUILD_TESTS)
  enable_testing()
endif()

# CUDA driver and cuBLASLt loaders (runtime/cuda). cublasLt.h (CUDA toolkit) gives cuBLASLt's
# types and signatures; the library itself is dlopen'ed.
find_path(PA_CUBLASLT_INCLUDE cublasLt.h PATHS /usr/local/cuda/include /usr/include REQUIRED)
add_library(pa_cuda_driver STATIC
  ${PA_ROOT}/runtime/cuda/cuda_driver.cpp
  ${PA_ROOT}/runtime/cuda/cuda_device.cpp
  ${PA_ROOT}/runtime/cuda/cublaslt.cpp
  ${PA_ROOT}/runtime/cuda/nccl.cpp
  ${PA_ROOT}/runtime/cuda/dynamic_library.cpp
  ${PA_ROOT}/runtime/cuda/launch.cpp
  ${PA_ROOT}/runtime/cuda/tensor_map.cpp)
target_include_directories(pa_cuda_driver PUBLIC ${PA_ROOT})
set_source_files_properties(${PA_ROOT}/runtime/cuda/cublaslt.cpp PROPERTIES INCLUDE_DIRECTORIES ${PA_CUBLASLT_INCLUDE})
target_link_libraries(pa_cuda_driver PUBLIC ${CMAKE_DL_LIBS})
set_target_properties(pa_cuda_driver PROPERTIES POSITION_INDEPENDENT_CODE ON)

# Kernel templates embedded as string constants (cmake/embed_kernels.cmake).
set(PA_EMBEDDED_KERNELS
  common/attention_mask.h
  kernels/flash_attention_params.h
  kernels/flash_attention_common.cuh
  kernels/flash_attention_fwd.cuh
  kernels/flash_attention_bwd_common.cuh
  kernels/flash_attention_bwd_mma.cuh
  kernels/flash_attention_bwd_ffma.cuh
  kernels/flash_attention_fwd_wgmma.cuh
  kernels/flash_attention_bwd_wgmma.cuh
  kernels/wgmma.cuh
  kernels/gemm_common.cuh
  kernels/gemm_ptx.cuh
  kernels/gemm_simt.cuh
  kernels/gemm_tf32.cuh
  kernels/mma_f64.cuh
  kernels/storage.cuh
  kernels/column_reduce.cuh
  kernels/norm.cuh
  kernels/pdl.cuh
  kernels/adam.cuh
  kernels/fused_mlp.cuh
  kernels/gemm_wgmma.cuh)
set(PA_EMBEDDED_DEPENDS "")
foreach(f IN LISTS PA_EMBEDDED_KERNELS)
  list(APPEND PA_EMBEDDED_DEPENDS ${PA_ROOT}/${f})
endforeach()
set(PA_EMBEDDED_CPP ${CMAKE_BINARY_DIR}/generated/embedded_kernels.cpp)
string(REPLACE ";" "|" PA_EMBEDDED_ARG "${PA_EMBEDDED_KERNELS}")
add_custom_command(
  OUTPUT ${PA_EMBEDDED_CPP}
  COMMAND ${CMAKE_COMMAND} -DROOT=${PA_ROOT} "-DINPUTS=${PA_EMBEDDED_ARG}" -DOUTPUT=${PA_EMBEDDED_CPP}
          -P ${PA_ROOT}/cmake/embed_kernels.cmake
  DEPENDS ${PA_EMBEDDED_DEPENDS} ${PA_ROOT}/cmake/embed_kernels.cmake
  COMMENT "Embedding kernel templates"
  VERBATIM)

# NVRTC wrapper, the kernel cache (memory and disk) and the embedded sources (codegen).
add_library(pa_nvrtc STATIC ${PA_ROOT}/codegen/nvrtc_compiler.cpp ${PA_ROOT}/codegen/kernel_cache.cpp ${PA_EMBEDDED_CPP})
target_include_directories(pa_nvrtc PUBLIC ${PA_ROOT})
target_link_libraries(pa_nvrtc PUBLIC ${CMAKE_DL_LIBS})
set_target_properties(pa_nvrtc PROPERTIES POSITION_INDEPENDENT_CODE ON)

# Flash attention: kernel choice and generated sources (codegen; no NVRTC, no driver), and the
# launcher that loads and launches them (runtime).
add_library(pa_flash_spec STATIC ${PA_ROOT}/codegen/flash_spec.cpp ${PA_ROOT}/codegen/flash_chooser.cpp
                                 ${PA_ROOT}/codegen/flash_variants.cpp)
target_include_directories(pa_flash_spec PUBLIC ${PA_ROOT})
set_target_properties(pa_flash_spec PROPERTIES POSITION_INDEPENDENT_CODE ON)
add_library(pa_flash STATIC ${PA_ROOT}/runtime/flash_attention.cpp)
target_include_directories(pa_flash PUBLIC ${PA_ROOT})
target_link_libraries(pa_flash PUBLIC pa_flash_spec pa_nvrtc pa_cuda_driver)
set_target_properties(pa_flash PROPERTIES POSITION_INDEPENDENT_CODE ON)

# Float64 reference the tests compare against (OpenMP over (batch, head) slices).
find_package(OpenMP REQUIRED)
add_library(pa_attention_reference STATIC ${PA_ROOT}/kernels/attention_reference.cpp)
target_include_directories(pa_attention_reference PUBLIC ${PA_ROOT})
target_link_libraries(pa_attention_reference PUBLIC OpenMP::OpenMP_CXX)

if(PA_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(Threads REQUIRED)

  # CI: NVRTC compiles every instantiation production can run (sm_80; sm_90a with the wgmma ones).
  add_executable(flash_nvrtc_tests ${PA_ROOT}/tests/nvrtc/flash_nvrtc_test.cpp)
  target_link_libraries(flash_nvrtc_tests PRIVATE pa_flash_spec pa_nvrtc GTest::gtest GTest::gtest_main Threads::Threads)
  set_target_properties(flash_nvrtc_tests PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/nvrtc)
  add_test(NAME flash_nvrtc_tests COMMAND flash_nvrtc_tests)
  set_tests_properties(flash_nvrtc_tests PROPERTIES LABELS nvrtc TIMEOUT 900 RESOURCE_LOCK nvrtc_flash)  # (see config_fuzz)

  # The bench-only variants (label sweep, not in CI's default run: ctest -L sweep).
  add_executable(flash_sweep_nvrtc_tests ${PA_ROOT}/tests/nvrtc/flash_sweep_nvrtc_test.cpp)
  target_link_libraries(flash_sweep_nvrtc_tests PRIVATE pa_flash_spec pa_nvrtc GTest::gtest GTest::gtest_main Threads::Threads)
  set_target_properties(flash_sweep_nvrtc_tests PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/nvrtc)
  add_test(NAME flash_sweep_nvrtc_tests COMMAND flash_sweep_nvrtc_tests)
  set_tests_properties(flash_sweep_nvrtc_tests PROPERTIES LABELS sweep TIMEOUT 1800)

  # GPU: kernels against the float64 reference; every test skips without a device.
  add_executable(flash_gpu_tests ${PA_ROOT}/tests/gpu/flash_attention_gpu_test.cpp)
  target_link_libraries(flash_gpu_tests PRIVATE pa_flash pa_attention_reference GTest::gtest GTest::gtest_main Threads::Threads)
  set_target_properties(flash_gpu_tests PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_test(NAME flash_gpu_tests COMMAND flash_gpu_tests)
  set_tests_properties(flash_gpu_tests PROPERTIES LABELS gpu TIMEOUT 1800)
endif()

if(PA_BUILD_FLASH_BENCH)
  # C API loaded by bench/attention_vs_torch.py through ctypes.
  add_library(pa_flash_bench SHARED ${PA_ROOT}/bench/flash_bench_capi.cpp)
  target_link_libraries(pa_flash_bench PRIVATE pa_flash)
  set_target_properties(pa_flash_bench PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endif()

# FFMA / fp64 tensor-core / conversion throughput per SM clock (the fp64Mma path's budget).
add_executable(fp64_mma_probe ${PA_ROOT}/bench/fp64_mma_probe.cpp)
target_link_libraries(fp64_mma_probe PRIVATE pa_nvrtc pa_cuda_driver)
set_target_properties(fp64_mma_probe PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
if(PA_BUILD_TESTS)
  foreach(arch sm_80 sm_90)
    add_test(NAME fp64_mma_probe_compiles_${arch} COMMAND fp64_mma_probe --compile-only ${arch})
    set_tests_properties(fp64_mma_probe_compiles_${arch} PROPERTIES LABELS nvrtc)
  endforeach()
endif()
