// One CUDA device through the run-time-loaded driver: primary context, properties, buffers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_driver.h"

namespace pa {
namespace cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;
  int multiprocessors = 0;
  int maxSharedBytesOptin = 0;  // dynamic shared memory a block may opt in to
  size_t totalMemory = 0;
  // NVRTC's target: sm_90a on Hopper (its architecture-specific instructions, wgmma and the
  // tensor memory accelerator, need the "a" target), sm_XY elsewhere.
  std::string arch() const { return "sm_" + std::to_string(major * 10 + minor) + (major == 9 && minor == 0 ? "a" : ""); }
};

// Retains the device's primary context (the one PyTorch and the runtime API use, so pointers and
// streams can be shared with them) and makes it current on the calling thread.
class Device {
 public:
  explicit Device(int ordinal = 0);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  const DeviceInfo& info() const { return info_; }
  void makeCurrent() const;
  void synchronize() const;

 private:
  DeviceInfo info_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Why `bytes` bytes at `ptr` cannot be read as memory of device `ordinal` ("" when they can):
// not an address the driver knows, memory of another device, or past the end of its allocation.
// Asks the driver about the address and touches nothing, so a wrong pointer from a caller is an
// error message, not a fault.
std::string deviceRangeProblem(CUdeviceptr ptr, size_t bytes, int ordinal);

// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // Fills with a 32-bit pattern (0x7fc00000 = quiet NaN for fp32 poisoning).
  void fill32(unsigned int pattern);

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// An owned stream. It is a blocking stream (CU_STREAM_DEFAULT): it orders with the legacy default
// stream, so the synchronous copies of upload()/download() never race with work queued here.
class Stream {
 public:
  // The context's least or greatest priority: where two streams' blocks wait for the same
  // multiprocessors, the greater one's go first.
  enum class Priority { Least, Greatest };
  explicit Stream(Priority priority = Priority::Least);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }
  void synchronize() const;
  // Work queued on this stream from now on waits for `event`'s last record (also while capturing:
  // a capture then takes this stream in).
  void wait(CUevent event) const;

 private:
  CUstream stream_ = nullptr;
};

// Page-locked host memory: asynchronous copies from and to it need no staging by the driver.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// An event (timing disabled unless asked for).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(CUstream stream);
  void synchronize() const;
  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

// Work captured from a stream once and replayed with one launch (a CUDA graph).
class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  // Everything `enqueue` queues on `stream` becomes the graph; nothing runs while capturing.
  template <typename Fn>
  void capture(const Stream& stream, Fn&& enqueue) {
    begin(stream);
    try {
      enqueue();
    } catch (...) {
      abandon(stream);
      throw;
    }
    end(stream);
  }
  bool ready() const { return exec_ != nullptr; }
  size_t nodeCount() const { return nodes_; }
  void launch(const Stream& stream) const;

 private:
  void begin(const Stream& stream);
  void end(const Stream& stream);
  void abandon(const Stream& stream);
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  size_t nodes_ = 0;
};

}  // namespace cuda
}  // namespace pa
