#include "dsv4/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/portable_math.h"

namespace dsv4 {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

int32_t argmax(std::span<const float> v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int32_t>(i);
  return best;
}

}  // namespace

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0 || temperature > 100)
    fail("temperature must be in [0, 100], got {}", temperature);
  if (!std::isfinite(top_p) || top_p <= 0 || top_p > 1) fail("top_p must be in (0, 1], got {}", top_p);
  if (top_k < 0) fail("top_k must be >= 0, got {}", top_k);
  if (!std::isfinite(min_p) || min_p < 0 || min_p > 1) fail("min_p must be in [0, 1], got {}", min_p);
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0 || repetition_penalty > 100)
    fail("repetition_penalty must be in (0, 100], got {}", repetition_penalty);
  if (!std::isfinite(frequency_penalty) || frequency_penalty < -2 || frequency_penalty > 2)
    fail("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  if (!std::isfinite(presence_penalty) || presence_penalty < -2 || presence_penalty > 2)
    fail("presence_penalty must be in [-2, 2], got {}", presence_penalty);
}

SamplingParams sampling_defaults_from(const std::string& path) {
  SamplingParams p;
  if (!path_exists(path)) return p;
  auto j = nlohmann::json::parse(read_small_file(path, 1 << 20), nullptr, false);
  if (!j.is_object()) fail("{}: not a JSON object", path);
  auto number = [&](const char* key, float* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number()) fail("{}: field {} must be a number", path, key);
    *out = it->get<float>();
  };
  number("temperature", &p.temperature);
  number("top_p", &p.top_p);
  number("min_p", &p.min_p);
  number("repetition_penalty", &p.repetition_penalty);
  if (auto it = j.find("top_k"); it != j.end() && it->is_number_integer()) p.top_k = it->get<int>();
  if (auto it = j.find("do_sample"); it != j.end() && it->is_boolean() && !it->get<bool>()) p.temperature = 0;
  try {
    p.validate();
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  return p;
}

Sampler::Sampler(const SamplingParams& p) : params_(p) {
  uint64_t s = p.seed;
  for (auto& word : state_) word = splitmix64(s);
}

double Sampler::next_uniform() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, size_t prompt_tokens) {
  const size_t V = logits.size();
  work_.assign(logits.begin(), logits.end());
  if (params_.repetition_penalty != 1.0f) {
    // Once per distinct token, as Hugging Face's processor (gather, then scatter).
    ids_.assign(history.begin(), history.end());
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
    for (int32_t id : ids_) {
      if (id < 0 || static_cast<size_t>(id) >= V) continue;
      float& l = work_[id];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    // Sorted, each run of one id is its count: c x frequency + presence, subtracted once.
    ids_.assign(history.begin() + std::min(prompt_tokens, history.size()), history.end());
    std::sort(ids_.begin(), ids_.end());
    for (size_t i = 0; i < ids_.size();) {
      size_t j = i;
      while (j < ids_.size() && ids_[j] == ids_[i]) ++j;
      if (ids_[i] >= 0 && static_cast<size_t>(ids_[i]) < V)
        work_[ids_[i]] -= static_cast<float>(j - i) * params_.frequency_penalty + params_.presence_penalty;
      i = j;
    }
  }
  if (params_.greedy()) return argmax(work_);

  // Candidates sorted by logit (descending, lower id first on ties).
  ids_.resize(V);
  std::iota(ids_.begin(), ids_.end(), 0);
  size_t keep = V;
  if (params_.top_k > 0) keep = std::min<size_t>(keep, static_cast<size_t>(params_.top_k));
  auto better = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
  std::partial_sort(ids_.begin(), ids_.begin() + keep, ids_.end(), better);
  ids_.resize(keep);

  // Softmax with temperature over the kept candidates (double for a stable cumulative sum).
  std::vector<double> prob(keep);
  const double inv_t = 1.0 / params_.temperature;
  const double top = work_[ids_[0]];
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob[i] = portable::exp((work_[ids_[i]] - top) * inv_t);
  for (double& p : prob) p /= total;

  size_t n = keep;
  if (params_.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (cum >= params_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * prob[0];
    size_t m = 1;
    while (m < n && prob[m] >= floor) ++m;
    n = m;
  }
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += prob[i];
  double r = next_uniform() * mass;
  for (size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r < 0) return ids_[i];
  }
  return ids_[n - 1];
}

}  // namespace dsv4
