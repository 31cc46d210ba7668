// A pass's products made by a team of threads that stays together for the whole pass.
//
// The codebook pass of a decode step (batch 1-4) is 135 products, each a read of a 2-12 MB
// weight, with small ops between them (norms, rotations, attention, the gate, sampling) that
// only the calling thread runs. Made one parallel region per product, the other threads waited
// in OpenMP's barrier meanwhile and the memory was idle: on the 2-core Zen 4 (2026-12-07) the
// products alone took 17-19 ms of a 22-26 ms pass. Here the caller runs the pass's code, small
// ops included, inside one region; the other threads, knowing the order of the products before
// the pass, read the next product's weights ahead into their caches while it does; then every
// thread takes that product's tasks, the caller from the first up and the others from the last
// down (those they read ahead first) until they meet. Each task is row_linear's (row_tiles.h),
// so the outputs are row_linear's bits whatever thread makes them. Measured in one process
// against one region per product (2026-12-07, alternating every pass, 400 pairs each): the
// codebook pass 1.8%, the slow step 2.0% and the decode step 4.3% faster (paired medians).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "packed_ops.h"
#include "row_tiles.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace streamtts_fused {

#if defined(__x86_64__) && defined(_OPENMP)

class ProductTeam {
 public:
  // Each helper thread reads at most this much of the next product's weights ahead: its L2 (1 MB
  // on Zen 4, 2 MB on Sapphire Rapids); the tiles stream the rest from memory. (0.25, 4 and 16
  // MB measured no better.)
  static constexpr int64_t kPrefetchBytes = 1 << 20;

  // Whether a team can make these products of `rows` rows on this thread: weights in the pairs
  // layout, a decode step's rows, threads to share them, and no parallel region around.
  static bool applies(const std::vector<Tensor>& weights, int64_t rows) {
    if (!avx512_bf16() || rows > kMaxRowsPerTile || at::get_num_threads() < 2 ||
        at::in_parallel_region()) {
      return false;
    }
    for (const Tensor& w : weights) {
      if (w.is_mkldnn() || w.scalar_type() != at::kBFloat16 || w.dim() != 4 ||
          w.size(2) != kOutputsPerTask || !w.is_contiguous()) {
        return false;
      }
    }
    return true;
  }

  // `weights`: the pass's products in the order it makes them (the pairs layout).
  explicit ProductTeam(std::vector<Tensor> weights)
      : weights_(std::move(weights)), jobs_(new Job[weights_.size()]) {}

  // body() on the calling thread while the team's other threads serve its products; an
  // exception from body is rethrown once they have stopped.
  void run(const std::function<void()>& body) {
    std::exception_ptr error;
#pragma omp parallel num_threads(at::get_num_threads())
    {
      if (omp_get_thread_num() == 0) {
        try {
          body();
        } catch (...) {
          error = std::current_exception();
        }
        finished_.store(true, std::memory_order_release);
      } else {
        serve(omp_get_thread_num() - 1, omp_get_num_threads() - 1);
      }
    }
    if (error) std::rethrow_exception(error);
    TORCH_CHECK(next_ == static_cast<int64_t>(weights_.size()), "ProductTeam: the pass made ",
                next_, " of its ", weights_.size(), " products");
  }

  // The body's next product (row_linear, or row_linear_add with a residual): x [..., K] bf16 of
  // at most kMaxRowsPerTile rows times `packed`, the order's next weight, plus the bias, plus
  // the residual [..., N] bf16 -> [..., N] bf16.
  Tensor product(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                 const std::optional<Tensor>& residual) {
    TORCH_CHECK(next_ < static_cast<int64_t>(weights_.size()) &&
                    packed.data_ptr() == weights_[next_].data_ptr(),
                "ProductTeam: products out of the order given");
    const RowProduct operands(x, packed, bias, residual);
    TORCH_CHECK(operands.m <= kMaxRowsPerTile, "ProductTeam: at most ", kMaxRowsPerTile, " rows");
    const int64_t tasks = operands.tasks;
    Job& job = jobs_[next_];
    job.operands = &operands;
    job.ready.store(true, std::memory_order_release);
    // The caller's tasks from the first up; the helpers' from the last down (serve).
    for (int64_t mine = 0; job.claimed.fetch_add(1, std::memory_order_relaxed) < tasks; ++mine) {
      run_job_task(job, mine);
    }
    for (int64_t spins = 0; job.done.load(std::memory_order_acquire) < tasks; ++spins) {
      wait(spins);
    }
    ++next_;
    return operands.output();
  }

 private:
  struct Job {
    std::atomic<bool> ready{false};
    std::atomic<int64_t> claimed{0};   // tasks claimed, by anyone (may run past the count)
    std::atomic<int64_t> from_top{0};  // of them, the helpers'
    std::atomic<int64_t> done{0};      // tasks whose outputs are written
    const RowProduct* operands = nullptr;  // set by the caller before `ready`
  };

  static void run_job_task(Job& job, int64_t task) {
    job.operands->run(kStreamedTiles, task);
    job.done.fetch_add(1, std::memory_order_release);
  }

  // Reads 16 lines from `line` on: loads, so that the lines do arrive (prefetch instructions,
  // dropped once the core's miss buffers are full, gained a third as much: 0.6% a pass).
  static void touch_lines(const char* line) {
    int32_t sum = 0;
    for (int i = 0; i < 16; ++i) sum += *reinterpret_cast<const volatile int32_t*>(line + 64 * i);
    sink_.store(sum, std::memory_order_relaxed);
  }

  // A spin; after some hundreds of microseconds of it, one that gives the core away between
  // checks (a host with more threads than cores: the thread waited for may need this core).
  static void wait(int64_t spins) {
    if (spins < (1 << 14)) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }

  // A helper thread (one of `helpers`): for each product in turn, read its tasks' weights ahead
  // from the last task down (this helper's share of them) until the caller posts it, then take
  // tasks from the last down until none is left.
  void serve(int helper, int helpers) {
    const int64_t count = static_cast<int64_t>(weights_.size());
    for (int64_t k = 0; k < count; ++k) {
      Job& job = jobs_[k];
      const Tensor& w = weights_[k];
      const int64_t tasks = w.size(0), task_bytes = w.size(1) * kBlocks * 64;
      const char* base = static_cast<const char*>(w.const_data_ptr());
      int64_t task = tasks - 1 - helper, offset = 0, budget = kPrefetchBytes;
      for (int64_t spins = 0; !job.ready.load(std::memory_order_acquire);) {
        if (finished_.load(std::memory_order_acquire)) return;
        if (task >= 0 && budget > 0) {
          const char* line = base + task * task_bytes + offset;
          touch_lines(line);
          offset += 16 * 64;
          budget -= 16 * 64;
          if (offset >= task_bytes) {
            offset = 0;
            task -= helpers;
          }
        } else {
          wait(spins++);
        }
      }
      while (job.claimed.fetch_add(1, std::memory_order_relaxed) < tasks) {
        run_job_task(job, tasks - 1 - job.from_top.fetch_add(1, std::memory_order_relaxed));
      }
    }
  }

  std::vector<Tensor> weights_;
  std::unique_ptr<Job[]> jobs_;
  int64_t next_ = 0;  // the caller's next product
  std::atomic<bool> finished_{false};
  static inline std::atomic<int32_t> sink_{0};  // keeps touch_lines' loads
};

// The products of a pass run by a team (packed_ops.h's EachProduct, made by the team).
struct TeamProducts {
  ProductTeam& team;
  Tensor linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias) const {
    return team.product(x, packed, bias, std::nullopt);
  }
  Tensor linear_add(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                    const Tensor& residual) const {
    return team.product(x, packed, bias, residual);
  }
};

#endif  // x86-64 with OpenMP

// body(products): a pass whose products are those of `order`, made in that order, by a team
// where one applies to `rows` rows here, else one at a time (EachProduct); the same bits.
template <class Body>
auto with_products(std::vector<Tensor> order, int64_t rows, const Body& body) {
#if defined(__x86_64__) && defined(_OPENMP)
  if (ProductTeam::applies(order, rows)) {
    ProductTeam team(std::move(order));
    decltype(body(EachProduct{})) result;
    team.run([&] { result = body(TeamProducts{team}); });
    return result;
  }
#endif
  return body(EachProduct{});
}

}  // namespace streamtts_fused
