// A small, portable random generator: the same seed gives the same numbers on every machine
// and standard library (std::normal_distribution is not specified bit for bit).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/hash.h"

namespace pa {

class Rng {
public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& s : s_) s = splitmix(x);
  }
  // A generator for a named stream (a parameter, a dataset) derived from the run's seed.
  static Rng stream(uint64_t seed, const std::string& name) {
    return Rng(seed ^ fnv1a(name.data(), name.size()));
  }
  uint64_t next() {  // xoshiro256**
    const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {  // Box-Muller, one value per call
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  // The generator's whole state, to save and restore it (checkpoints). A state of four zeros
  // is xoshiro's one fixed point and never arises from a seed; setState refuses it.
  using State = std::array<uint64_t, 4>;
  State state() const { return {s_[0], s_[1], s_[2], s_[3]}; }
  bool setState(const State& s) {
    if ((s[0] | s[1] | s[2] | s[3]) == 0) return false;
    for (size_t i = 0; i < 4; ++i) s_[i] = s[i];
    return true;
  }

  // The state `draws` calls of next() ahead of this one, in O(1) per call once made: xoshiro's
  // step is linear over GF(2), so the step taken `draws` times is one 256 x 256 bit matrix (built
  // by squaring, about 2 log2(draws) matrix products). For data generated in parallel with the
  // numbers of one sequential stream.
  class Jump {
  public:
    explicit Jump(uint64_t draws) {
      Matrix step{}, acc{};
      for (int col = 0; col < 256; ++col) {  // column col: the step applied to unit vector col
        Rng r(0);
        State unit{};
        unit[static_cast<size_t>(col / 64)] = uint64_t{1} << (col % 64);
        r.setRaw(unit);
        r.next();
        step[static_cast<size_t>(col)] = r.state();
      }
      for (int i = 0; i < 256; ++i) acc[static_cast<size_t>(i)][static_cast<size_t>(i / 64)] = uint64_t{1} << (i % 64);
      for (; draws; draws >>= 1) {
        if (draws & 1) acc = product(step, acc);
        step = product(step, step);
      }
      m_ = acc;
    }
    State apply(const State& s) const { return times(m_, s); }

  private:
    using Matrix = std::array<State, 256>;  // column j of the matrix: the image of unit vector j
    static State times(const Matrix& m, const State& v) {
      State out{};
      for (int j = 0; j < 256; ++j)
        if ((v[static_cast<size_t>(j / 64)] >> (j % 64)) & 1)
          for (size_t w = 0; w < 4; ++w) out[w] ^= m[static_cast<size_t>(j)][w];
      return out;
    }
    static Matrix product(const Matrix& a, const Matrix& b) {  // a · b: b first, then a
      Matrix c{};
      for (size_t j = 0; j < 256; ++j) c[j] = times(a, b[j]);
      return c;
    }
    Matrix m_{};
  };

private:
  void setRaw(const State& s) {  // any state, the fixed point too (the jump's unit vectors)
    for (size_t i = 0; i < 4; ++i) s_[i] = s[i];
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace pa
