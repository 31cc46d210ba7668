// packed_ops.h's elementwise row ops as ops of their own: streamtts_fused::rms_norm and
// streamtts_fused::rotate_pairs_rounded. The fused ops call the inline functions directly; these
// let tests hold them to the Python kernels' bits on any input (NaN, infinities, denormals,
// lengths no multiple of a vector, rows enough to be split between threads).

#include <torch/library.h>

#include "packed_ops.h"

TORCH_LIBRARY_FRAGMENT(streamtts_fused, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &streamtts_fused::rms_norm);
  m.def("rotate_pairs_rounded(Tensor rows, int heads, int dh, Tensor cos, Tensor sin) -> Tensor",
        &streamtts_fused::rotate_pairs_rounded);
}
