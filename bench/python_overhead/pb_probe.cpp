// pybind11 side of bench/python_call_overhead.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
namespace py = pybind11;
PYBIND11_MODULE(pb_probe, m) {
  m.def("noop", [](long v) { return v; });
  m.def("first", [](py::array_t<float, py::array::c_style> a) { return a.size() ? *a.data() : 0.0f; });
}
