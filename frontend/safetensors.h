// The safetensors file format (https://huggingface.co/docs/safetensors): reading with every
// check a damaged or hostile file needs, and writing atomically. Nothing here knows about graphs,
// configs or training; frontend/checkpoint.h builds on it.
//
// Note on the format. A file is an 8-byte little-endian unsigned header length N, then N bytes
// of a JSON object, then the data buffer. Each key of the object but "__metadata__" names a
// tensor: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, offsets in bytes
// relative to the start of the buffer, end - begin == numel * dtype size, row-major, little-endian.
// "__metadata__" (optional) maps strings to strings. As the reference implementation requires,
// the tensors tile the buffer exactly: no overlap, no hole, nothing after the last one. The
// writer pads the header with spaces to a multiple of 8 bytes, so every tensor's data starts
// 8-byte aligned in the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/errors.h"

namespace pa::safetensors {

// Every dtype of the format. Reading accepts all of them (to check sizes and report what a file
// holds); toDoubles converts the floating-point ones.
enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, Bool };

const char* dtypeName(DType t);  // "F32", as in the file
size_t dtypeSize(DType t);       // bytes per element
bool parseDType(const std::string& name, DType& out);
bool isFloat(DType t);           // F64, F32, F16, BF16, F8_*

// A damaged or malformed file, or one that cannot be read or written: "<file>: <problem>".
// A UserError (exit code 2): the file is the user's.
class FormatError : public UserError {
public:
  FormatError(const std::string& file, const std::string& problem) : UserError(file + ": " + problem) {}
};

// A tensor to write: its bytes are raw little-endian row-major data of `dtype`.
struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  static Tensor f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
  static Tensor f64(const std::string& name, std::vector<int64_t> shape, const std::vector<double>& values);
  static Tensor i64(const std::string& name, std::vector<int64_t> shape, const std::vector<int64_t>& values);
  static Tensor u64(const std::string& name, std::vector<int64_t> shape, const std::vector<uint64_t>& values);
  // `values` rounded to `dtype` (F64 or F32; F16 and BF16 round to nearest even).
  static Tensor fromDoubles(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const std::vector<double>& values);
};

using Metadata = std::map<std::string, std::string>;

// The bytes of a file holding `tensors` (in the given order) and `metadata`. Throws
// std::invalid_argument for a name given twice, "__metadata__" as a name, or bytes that do not
// match the shape (the caller's bug, not the user's).
std::string serialize(const std::vector<Tensor>& tensors, const Metadata& metadata);

// Writes serialize(...) to `path` atomically (frontend/atomic_file.h): a crash, a kill or a full
// disk leaves either the old file or the new one. Throws FormatError naming the file.
void write(const std::string& path, const std::vector<Tensor>& tensors, const Metadata& metadata);

// One tensor of a file that was read: where its bytes are in the buffer.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets into the data buffer
  int64_t numel() const;
};

// A file read into memory and checked: every tensor's dtype is known, its shape's element count
// times the dtype size equals its byte range, the ranges tile the buffer, names are unique, the
// metadata is a map of strings.
class File {
public:
  // Reads and checks `path`. Throws FormatError: missing or unreadable file, a directory,
  // truncated, header length beyond the file or above 100 MB, header not JSON or not an object,
  // a key given twice, unknown dtype, bad shape, offsets out of range, overlapping or leaving a
  // hole, a size that does not match the shape, metadata that is not a map of strings.
  static File read(const std::string& path);
  // The same checks on bytes in memory; `name` stands for the file in messages.
  static File parse(std::string bytes, const std::string& name);

  const std::string& name() const { return name_; }
  const Metadata& metadata() const { return metadata_; }
  // The tensors in the order of their data (ascending offsets).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  // The raw bytes of a tensor.
  const uint8_t* data(const TensorInfo& t) const;
  // A floating-point tensor's values, exactly (every listed float dtype fits a double). Throws
  // FormatError for an integer or boolean tensor.
  std::vector<double> toDoubles(const TensorInfo& t) const;
  // An I64 tensor's values (U64 too, when each value fits an int64). Throws FormatError for others.
  std::vector<int64_t> toInt64(const TensorInfo& t) const;
  // A U64 tensor's values. Throws FormatError for other dtypes.
  std::vector<uint64_t> toUint64(const TensorInfo& t) const;

private:
  std::string name_;
  std::string bytes_;      // the whole file
  size_t dataStart_ = 0;   // 8 + header length
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_

  void checkOwn(const TensorInfo& t) const;  // throws std::invalid_argument for another file's tensor
};

// The metadata of the file at `path`, reading only its header: the checks of File::read but for
// the data's contents (a header listing the tensors is checked against the file's size). Throws
// FormatError.
Metadata readMetadata(const std::string& path);

// "[2, 3]"
std::string shapeText(const std::vector<int64_t>& shape);

}  // namespace pa::safetensors
