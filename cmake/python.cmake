# Finds Python and nanobind for the module `pureattention` (python/). Sets PA_PYTHON_MODULE when
# the module is to be built. nanobind comes from PyPI (README "Dependencies"); its CMake folder is
# asked from the interpreter, so a pip-installed nanobind is found without further settings.
find_package(Python 3.8 COMPONENTS Interpreter Development.Module )
set(PA_PYTHON_MODULE OFF)
if(Python_FOUND)
  execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                  OUTPUT_VARIABLE PA_NANOBIND_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE PA_NANOBIND_RESULT ERROR_QUIET)
  if(PA_NANOBIND_RESULT EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH "${PA_NANOBIND_DIR}")
    find_package(nanobind CONFIG)
  endif()
endif()
if(nanobind_FOUND)
  set(PA_PYTHON_MODULE ON)
elseif(PA_BUILD_PYTHON STREQUAL "ON")
  message(FATAL_ERROR "PA_BUILD_PYTHON=ON needs Python's development headers and nanobind "
                      "(python3 -m pip install nanobind)")
else()
  message(STATUS "Python module not built: nanobind not found (python3 -m pip install nanobind)")
endif()
