// TensorView helpers.
#include "core/tensor.h"

namespace ds {

TensorView TensorView::contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                                  Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = int(shape.size() > size_t(kMaxRank) ? kMaxRank : shape.size());
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[size_t(i)] = shape[size_t(i)];
    v.strides[size_t(i)] = stride;
    stride *= shape[size_t(i)];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[size_t(i)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[size_t(i)] != 1 && strides[size_t(i)] != stride) return false;
    stride *= shape[size_t(i)];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string s(dtype_name(dtype));
  s += "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[size_t(i)]);
  }
  s += "]";
  return s;
}

}  // namespace ds
