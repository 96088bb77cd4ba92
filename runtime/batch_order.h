// The order in which training samples are drawn: a seeded shuffle per epoch, the same for the
// CPU and CUDA sessions so that both see the same batches.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "common/rng.h"

namespace pa {

class BatchOrder {
public:
  BatchOrder(int64_t count, uint64_t seed, bool shuffle)
      : order_(static_cast<size_t>(count)), cursor_(order_.size()), rng_(Rng::stream(seed, "data/batches")), shuffle_(shuffle) {
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
  // The sample indices of the next batch.
  const int64_t* next(int64_t batch) {
    if (cursor_ + static_cast<size_t>(batch) > order_.size()) {
      if (shuffle_)
        for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng_.below(i)]);
      cursor_ = 0;
    }
    const int64_t* b = order_.data() + cursor_;
    cursor_ += static_cast<size_t>(batch);
    return b;
  }

private:
  std::vector<int64_t> order_;
  size_t cursor_;
  Rng rng_;
  bool shuffle_;
};

}  // namespace pa
