#include "reference.h"

#include <Eigen/Dense>
#include <cmath>
#include <limits>

namespace flashstep {

namespace {
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstFloatMap =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
}  // namespace

ReferenceResult reference_forward(const Problem& p, const float* Q, const float* K,
                                  const float* V) {
  return reference_forward_rows(p, Q, K, V, 1);
}

ReferenceResult reference_forward_rows(const Problem& p, const float* Q, const float* K,
                                       const float* V, std::int64_t row_step) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ReferenceResult r;
  r.O.assign(static_cast<size_t>(p.q_elems()), nan);
  r.L.assign(static_cast<size_t>(p.lse_elems()), nan);
  const double scale = p.softmax_scale();

  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    const Matrix Kh = ConstFloatMap(K + bh * p.Nk * p.d, p.Nk, p.d).cast<double>();
    const Matrix Vh = ConstFloatMap(V + bh * p.Nk * p.d, p.Nk, p.d).cast<double>();
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
          ConstFloatMap(Q + (bh * p.Nq + i) * p.d, 1, p.d).cast<double>();
      const Eigen::RowVectorXd s = scale * (qi * Kh.topRows(visible).transpose());
      const double m = s.maxCoeff();
      const Eigen::RowVectorXd e = (s.array() - m).exp().matrix();
      const double l = e.sum();
      Oi = (e * Vh.topRows(visible)) / l;
      Li = m + std::log(l);
    }
  }
  return r;
}

}  // namespace flashstep
