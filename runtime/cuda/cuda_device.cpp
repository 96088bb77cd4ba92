// Device, primary context and owning buffers over the loaded driver table.
#include "runtime/cuda/cuda_device.h"

namespace pa {
namespace cuda {

Device::Device(int ordinal) {
  Driver& drv = Driver::instance();
  if (!drv.available()) throw CudaError(drv.unavailableReason(), -1);
  PA_CU_CHECK(cuDeviceGet(&device_, ordinal));
  char name[256] = {0};
  PA_CU_CHECK(cuDeviceGetName(name, sizeof(name) - 1, device_));
  info_.ordinal = ordinal;
  info_.name = name;
  PA_CU_CHECK(cuDeviceGetAttribute(&info_.major, kAttrComputeCapabilityMajor, device_));
  PA_CU_CHECK(cuDeviceGetAttribute(&info_.minor, kAttrComputeCapabilityMinor, device_));
  PA_CU_CHECK(cuDeviceGetAttribute(&info_.multiprocessors, kAttrMultiprocessorCount, device_));
  PA_CU_CHECK(cuDeviceGetAttribute(&info_.maxSharedBytesOptin, kAttrMaxSharedMemoryPerBlockOptin, device_));
  PA_CU_CHECK(cuDeviceTotalMem(&info_.totalMemory, device_));
  PA_CU_CHECK(cuDevicePrimaryCtxRetain(&context_, device_));
  makeCurrent();
}

Device::~Device() {
  if (context_) Driver::instance().api().cuDevicePrimaryCtxRelease(device_);
}

void Device::makeCurrent() const { PA_CU_CHECK(cuCtxSetCurrent(context_)); }
void Device::synchronize() const { PA_CU_CHECK(cuCtxSynchronize()); }

std::string deviceRangeProblem(CUdeviceptr ptr, size_t bytes, int ordinal) {
  const DriverApi& api = Driver::instance().api();
  int owner = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  if (api.cuPointerGetAttribute(&owner, kPointerAttrDeviceOrdinal, ptr) != kCudaSuccess ||
      api.cuPointerGetAttribute(&start, kPointerAttrRangeStartAddr, ptr) != kCudaSuccess ||
      api.cuPointerGetAttribute(&size, kPointerAttrRangeSize, ptr) != kCudaSuccess)
    return "its address is not memory the CUDA driver of this process allocated";
  if (owner != ordinal)
    return "it is memory of CUDA device " + std::to_string(owner) + ", not of device " + std::to_string(ordinal);
  if (ptr < start || ptr - start > size || bytes > size - (ptr - start))
    return "its " + std::to_string(bytes) + " bytes run past the end of its allocation";
  return "";
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) PA_CU_CHECK(cuMemAlloc(&ptr_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) Driver::instance().api().cuMemFree(ptr_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) Driver::instance().api().cuMemFree(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = 0, o.bytes_ = 0;
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes) PA_CU_CHECK(cuMemcpyHtoD(ptr_, host, bytes));
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes) PA_CU_CHECK(cuMemcpyDtoH(host, ptr_, bytes));
}
void DeviceBuffer::fill32(unsigned int pattern) {
  if (bytes_ >= 4) PA_CU_CHECK(cuMemsetD32(ptr_, pattern, bytes_ / 4));
}

Stream::Stream(Priority priority) {
  int least = 0, greatest = 0;
  PA_CU_CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
  PA_CU_CHECK(cuStreamCreateWithPriority(&stream_, kStreamDefault, priority == Priority::Least ? least : greatest));
}
Stream::~Stream() {
  if (stream_) Driver::instance().api().cuStreamDestroy(stream_);
}
void Stream::synchronize() const { PA_CU_CHECK(cuStreamSynchronize(stream_)); }
void Stream::wait(CUevent event) const { PA_CU_CHECK(cuStreamWaitEvent(stream_, event, 0)); }

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) PA_CU_CHECK(cuMemAllocHost(&ptr_, bytes));
}
PinnedBuffer::~PinnedBuffer() {
  if (ptr_) Driver::instance().api().cuMemFreeHost(ptr_);
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) Driver::instance().api().cuMemFreeHost(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

Event::Event(bool timing) { PA_CU_CHECK(cuEventCreate(&event_, timing ? 0u : 2u /* CU_EVENT_DISABLE_TIMING */)); }
Event::~Event() {
  if (event_) Driver::instance().api().cuEventDestroy(event_);
}
void Event::record(CUstream stream) { PA_CU_CHECK(cuEventRecord(event_, stream)); }
void Event::synchronize() const { PA_CU_CHECK(cuEventSynchronize(event_)); }

CapturedGraph::~CapturedGraph() {
  const DriverApi& api = Driver::instance().api();
  if (exec_) api.cuGraphExecDestroy(exec_);
  if (graph_) api.cuGraphDestroy(graph_);
}

// Thread-local capture: other threads (the kernel compiler, a logger) stay free to call the
// driver while this one records.
void CapturedGraph::begin(const Stream& stream) { PA_CU_CHECK(cuStreamBeginCapture(stream.get(), kStreamCaptureModeThreadLocal)); }

void CapturedGraph::end(const Stream& stream) {
  PA_CU_CHECK(cuStreamEndCapture(stream.get(), &graph_));
  PA_CU_CHECK(cuGraphGetNodes(graph_, nullptr, &nodes_));
  PA_CU_CHECK(cuGraphInstantiate(&exec_, graph_, 0));
}

void CapturedGraph::abandon(const Stream& stream) {
  CUgraph partial = nullptr;
  const DriverApi& api = Driver::instance().api();
  if (api.cuStreamEndCapture(stream.get(), &partial) == kCudaSuccess && partial) api.cuGraphDestroy(partial);
}

void CapturedGraph::launch(const Stream& stream) const { PA_CU_CHECK(cuGraphLaunch(exec_, stream.get())); }

}  // namespace cuda
}  // namespace pa
