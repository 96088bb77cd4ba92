// nanobind side of bench/python_call_overhead.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
namespace nb = nanobind;
NB_MODULE(nb_probe, m) {
  m.def("noop", [](long v) { return v; });
  m.def("first", [](nb::ndarray<const float, nb::c_contig, nb::device::cpu> a) { return a.size() ? a.data()[0] : 0.0f; });
}
