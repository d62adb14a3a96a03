#include "reference.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "parallel.h"
#include "rounding.h"

namespace flashstep {

namespace {
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Rows 0, row_step, 2 row_step, ... of every head; the rest stay NaN.
template <typename T>
ReferenceResult forward_rows(const Problem& p, const T* Q, const T* K, const T* V,
                             std::int64_t row_step) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ReferenceResult r;
  r.O.assign(static_cast<size_t>(p.q_elems()), nan);
  r.L.assign(static_cast<size_t>(p.lse_elems()), nan);
  const double scale = p.softmax_scale();

  parallel_for(p.heads(), [&](std::int64_t bh) {  // each head writes its own rows
    const std::int64_t kv = p.kv_head(bh);  // the K/V head of bh's group
    const Matrix Kh = ConstMap<T>(K + kv * p.Nk * p.d, p.Nk, p.d).template cast<double>();
    const Matrix Vh = ConstMap<T>(V + kv * p.Nk * p.d, p.Nk, p.d).template cast<double>();
    for (std::int64_t i = 0; i < p.Nq; i += row_step) {
      Eigen::Map<Eigen::RowVectorXd> Oi(r.O.data() + (bh * p.Nq + i) * p.d, p.d);
      double& Li = r.L[static_cast<size_t>(bh * p.Nq + i)];
      const std::int64_t visible = p.visible_keys(i);
      if (visible == 0) {  // the contract: a row that sees no key gives O = 0, L = -inf
        Oi.setZero();
        Li = -std::numeric_limits<double>::infinity();
        continue;
      }
      const Eigen::RowVectorXd qi =
          ConstMap<T>(Q + (bh * p.Nq + i) * p.d, 1, p.d).template cast<double>();
      const Eigen::RowVectorXd s = scale * (qi * Kh.topRows(visible).transpose());
      const double m = s.maxCoeff();
      const Eigen::RowVectorXd e = (s.array() - m).exp().matrix();
      const double l = e.sum();
      Oi = (e * Vh.topRows(visible)) / l;
      Li = m + std::log(l);
    }
  });
  return r;
}

template <typename T>
ReferenceGradients backward(const Problem& p, const T* Q, const T* K, const T* V, const T* dO) {
  ReferenceGradients g;
  g.dQ.assign(static_cast<size_t>(p.q_elems()), 0.0);
  g.dK.assign(static_cast<size_t>(p.kv_elems()), 0.0);
  g.dV.assign(static_cast<size_t>(p.kv_elems()), 0.0);
  const double scale = p.softmax_scale();
  // One K/V head at a time per thread, its group's query heads in order: the
  // sums into a shared dK and dV stay in one thread and in the serial order.
  parallel_for(p.B * p.kv_heads(), [&](std::int64_t kv) {
    for (std::int64_t member = 0; member < p.group(); ++member) {
      // Query head `member` of the group (kv_head_of, inverted).
      const std::int64_t bh = kv / p.kv_heads() * p.H + kv % p.kv_heads() * p.group() + member;
      const Matrix Qh = ConstMap<T>(Q + bh * p.Nq * p.d, p.Nq, p.d).template cast<double>();
      const Matrix Kh = ConstMap<T>(K + kv * p.Nk * p.d, p.Nk, p.d).template cast<double>();
      const Matrix Vh = ConstMap<T>(V + kv * p.Nk * p.d, p.Nk, p.d).template cast<double>();
      const Matrix dOh = ConstMap<T>(dO + bh * p.Nq * p.d, p.Nq, p.d).template cast<double>();
      // P, row by row with the max subtracted; masked keys and empty rows give 0.
      Matrix P = Matrix::Zero(p.Nq, p.Nk);
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t visible = p.visible_keys(i);
        if (visible == 0) continue;
        const Eigen::RowVectorXd s = scale * (Qh.row(i) * Kh.topRows(visible).transpose());
        const Eigen::RowVectorXd e = (s.array() - s.maxCoeff()).exp().matrix();
        P.row(i).head(visible) = e / e.sum();
      }
      const Matrix O = P * Vh;
      const Matrix dP = dOh * Vh.transpose();
      const Eigen::VectorXd D = (dOh.array() * O.array()).rowwise().sum().matrix();
      const Matrix dS = (P.array() * (dP.colwise() - D).array()).matrix();
      Eigen::Map<Matrix>(g.dQ.data() + bh * p.Nq * p.d, p.Nq, p.d) = scale * dS * Kh;
      // A K/V head shared by a group of query heads gets the sum of their gradients.
      Eigen::Map<Matrix>(g.dK.data() + kv * p.Nk * p.d, p.Nk, p.d) += scale * dS.transpose() * Qh;
      Eigen::Map<Matrix>(g.dV.data() + kv * p.Nk * p.d, p.Nk, p.d) += P.transpose() * dOh;
    }
  });
  return g;
}
}  // namespace

ReferenceResult reference_forward(const Problem& p, const float* Q, const float* K,
                                  const float* V) {
  return forward_rows(p, Q, K, V, 1);
}

ReferenceResult reference_forward(const Problem& p, const double* Q, const double* K,
                                  const double* V) {
  return forward_rows(p, Q, K, V, 1);
}

ReferenceResult reference_forward_rows(const Problem& p, const float* Q, const float* K,
                                       const float* V, std::int64_t row_step) {
  return forward_rows(p, Q, K, V, row_step);
}

std::vector<double> naive_low_precision_rows(const Problem& p, const float* Q, const float* K,
                                             const float* V, std::int64_t row_step) {
  using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  std::vector<double> O(static_cast<size_t>(p.q_elems()), std::numeric_limits<double>::quiet_NaN());
  const auto scale = static_cast<float>(p.softmax_scale());  // the kernels' fp32 scale
  const DType t = p.dtype;
  parallel_for(p.heads(), [&](std::int64_t bh) {  // each head writes its own rows
    const auto Kh = ConstMap<float>(K + p.kv_head(bh) * p.Nk * p.d, p.Nk, p.d);
    const auto Vh = ConstMap<float>(V + p.kv_head(bh) * p.Nk * p.d, p.Nk, p.d);
    for (std::int64_t i = 0; i < p.Nq; i += row_step) {
      double* Oi = O.data() + (bh * p.Nq + i) * p.d;
      const std::int64_t visible = p.visible_keys(i);
      if (visible == 0) {  // the contract: a row that sees no key gives O = 0
        std::fill(Oi, Oi + p.d, 0.0);
        continue;
      }
      const auto qi = ConstMap<float>(Q + (bh * p.Nq + i) * p.d, 1, p.d);
      const MatrixF s = scale * (qi * Kh.topRows(visible).transpose());
      const MatrixF e = (s.array() - s.maxCoeff()).exp().matrix();
      MatrixF P = e / e.sum();
      round_to_dtype(t, P.data(), P.size());
      MatrixF o = P * Vh.topRows(visible);
      round_to_dtype(t, o.data(), o.size());
      for (std::int64_t k = 0; k < p.d; ++k) Oi[k] = o(0, k);
    }
  });
  return O;
}

ReferenceGradients naive_low_precision_backward(const Problem& p, const float* Q, const float* K,
                                                const float* V, const float* dO,
                                                const float* O_given) {
  const std::vector<double> O = O_given != nullptr
                                    ? std::vector<double>(O_given, O_given + p.q_elems())
                                    : naive_low_precision_rows(p, Q, K, V, 1);
  const auto scale = static_cast<float>(p.softmax_scale());
  const DType t = p.dtype;
  const auto d = static_cast<size_t>(p.d);
  ReferenceGradients g;
  g.dQ.assign(static_cast<size_t>(p.q_elems()), 0.0);
  g.dK.assign(static_cast<size_t>(p.kv_elems()), 0.0);
  g.dV.assign(static_cast<size_t>(p.kv_elems()), 0.0);
  // One K/V head at a time per thread, its group's query heads in order (as
  // reference_backward): each writes its own dQ rows, and the group's dK and
  // dV sum in fp32 accumulators rounded once at the end, as a kernel that
  // keeps dK_j and dV_j on chip across the group's heads would.
  parallel_for(p.B * p.kv_heads(), [&](std::int64_t kv) {
    std::vector<float> dK(static_cast<size_t>(p.Nk) * d, 0.0f), dV(dK.size(), 0.0f);
    const float* Kh = K + kv * p.Nk * p.d;  // [Nk, d]
    const float* Vh = V + kv * p.Nk * p.d;  // [Nk, d]
    for (std::int64_t member = 0; member < p.group(); ++member) {
      const std::int64_t bh = kv / p.kv_heads() * p.H + kv % p.kv_heads() * p.group() + member;
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t visible = p.visible_keys(i);
        if (visible == 0) continue;
        const float* qi = Q + (bh * p.Nq + i) * p.d;
        const float* dOi = dO + (bh * p.Nq + i) * p.d;
        const double* Oi = O.data() + (bh * p.Nq + i) * p.d;
        std::vector<float> P(static_cast<size_t>(visible));
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j < visible; ++j) {
          float dot = 0.0f;
          for (size_t k = 0; k < d; ++k) dot += qi[k] * Kh[j * p.d + k];
          P[j] = scale * dot;
          m = std::max(m, P[j]);
        }
        float l = 0.0f;
        for (float& x : P) l += (x = std::exp(x - m));
        float D = 0.0f;
        for (size_t k = 0; k < d; ++k) D += dOi[k] * static_cast<float>(Oi[k]);
        std::vector<float> dQi(d, 0.0f);
        for (std::int64_t j = 0; j < visible; ++j) {
          const float Pij = P[j] / l;
          float dP = 0.0f;
          for (size_t k = 0; k < d; ++k) dP += dOi[k] * Vh[j * p.d + k];
          const float dS = round_to_dtype(t, Pij * (dP - D));
          const float P16 = round_to_dtype(t, Pij);
          for (size_t k = 0; k < d; ++k) {
            dV[j * d + k] += P16 * dOi[k];
            dK[j * d + k] += dS * qi[k];
            dQi[k] += dS * Kh[j * p.d + k];
          }
        }
        for (size_t k = 0; k < d; ++k) {
          g.dQ[(bh * p.Nq + i) * p.d + k] = round_to_dtype(t, scale * dQi[k]);
        }
      }
    }
    for (size_t e = 0; e < dK.size(); ++e) {
      g.dK[kv * p.Nk * p.d + e] = round_to_dtype(t, scale * dK[e]);
      g.dV[kv * p.Nk * p.d + e] = round_to_dtype(t, dV[e]);
    }
  });
  return g;
}

ReferenceGradients reference_backward(const Problem& p, const float* Q, const float* K,
                                      const float* V, const float* dO) {
  return backward(p, Q, K, V, dO);
}

ReferenceGradients reference_backward(const Problem& p, const double* Q, const double* K,
                                      const double* V, const double* dO) {
  return backward(p, Q, K, V, dO);
}

}  // namespace flashstep
