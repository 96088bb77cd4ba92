// The order in which training samples are drawn: a seeded shuffle per epoch, the same for the
// CPU and CUDA sessions so that both see the same batches. Its state can be saved and restored,
// so that a resumed run draws exactly the batches the uninterrupted one would have.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/rng.h"

namespace pa {

class BatchOrder {
public:
  // Everything the next batches depend on: the current permutation (each epoch shuffles the
  // previous one, so it is state, not a function of the seed alone), the position in it, the
  // generator, and how many epochs have started.
  struct State {
    std::vector<int64_t> order;
    int64_t cursor = 0;
    int64_t epoch = 0;
    Rng::State rng{};
  };

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
      ++epoch_;
    }
    const int64_t* b = order_.data() + cursor_;
    cursor_ += static_cast<size_t>(batch);
    return b;
  }

  State state() const { return State{order_, static_cast<int64_t>(cursor_), epoch_, rng_.state()}; }
  // Why `s` cannot continue this order ("" when it can): it must be a permutation of this
  // order's samples with its cursor inside it.
  std::string incompatibility(const State& s) const {
    if (s.order.size() != order_.size())
      return "its batch order covers " + std::to_string(s.order.size()) + " training samples, this run's data has " +
             std::to_string(order_.size());
    std::vector<char> seen(order_.size(), 0);
    for (int64_t i : s.order) {
      if (i < 0 || static_cast<size_t>(i) >= order_.size() || seen[static_cast<size_t>(i)])
        return "its batch order is not a permutation of the training samples";
      seen[static_cast<size_t>(i)] = 1;
    }
    if (s.cursor < 0 || static_cast<size_t>(s.cursor) > order_.size()) return "its batch order's position is out of range";
    if (s.epoch < 0) return "its epoch count is negative";
    if ((s.rng[0] | s.rng[1] | s.rng[2] | s.rng[3]) == 0) return "its random generator state is all zeros";
    return "";
  }
  // Takes `s`, which incompatibility() accepted.
  void restore(const State& s) {
    order_ = s.order;
    cursor_ = static_cast<size_t>(s.cursor);
    epoch_ = s.epoch;
    rng_.setState(s.rng);
  }

private:
  std::vector<int64_t> order_;
  size_t cursor_;
  int64_t epoch_ = 0;
  Rng rng_;
  bool shuffle_;
};

}  // namespace pa
