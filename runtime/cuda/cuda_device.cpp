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

}  // namespace cuda
}  // namespace pa
