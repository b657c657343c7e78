// Embedding lookup and its gradient, plus the learned positional table's add and gradient.
//
// ids is an int32 CPU tensor of any shape (typically [B, T]); table is float32 [V, D]. The
// lookup writes out[i, :] = table[ids[i], :] with out viewed as [ids.numel(), D]; its gradient
// scatter-adds dtable[ids[i], :] += dout[i, :] (repeated ids accumulate). Every id is checked to
// lie in [0, V) before anything is written, and an error names the first bad one.
//
// Positions: out viewed as [rows, T, D] gets out[r, t, :] += pos[t, :] for a [P, D] table with
// T <= P; its gradient is dpos[t, :] += Σ_r dout[r, t, :].
#pragma once

#include <pipeline/core/tensor.hpp>

namespace pipeline::ops {

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);

void add_positions(Tensor& out, std::int64_t steps, const Tensor& pos);
void positions_grad(const Tensor& dout, std::int64_t steps, Tensor& dpos);

}  // namespace pipeline::ops
