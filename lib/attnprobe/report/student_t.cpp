#include "attnprobe/report/student_t.h"

#include <cmath>
#include <limits>

namespace attnprobe {

namespace {

// The continued fraction of the regularized incomplete beta function I_x(a, b), evaluated by the modified Lentz
// method; it converges fast for x < (a + 1) / (a + b + 2), which the caller arranges by symmetry.
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
    c = 1 + aa / c;
    c = std::fabs(c) < kTiny ? kTiny : c;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
    c = 1 + aa / c;
    c = std::fabs(c) < kTiny ? kTiny : c;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < 1e-15) break;
  }
  return h;
}

double regularized_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double log_front = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1) / (a + b + 2)) return std::exp(log_front) * beta_continued_fraction(a, b, x) / a;
  return 1 - std::exp(log_front) * beta_continued_fraction(b, a, 1 - x) / b;
}

}  // namespace

double student_t_cdf(double t, double dof) {
  if (!(dof > 0) || std::isnan(t)) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  const double tail = 0.5 * regularized_beta(dof / 2, 0.5, dof / (dof + t * t));  // P(T > |t|)
  return t > 0 ? 1 - tail : tail;
}

double student_t_quantile(double prob, double dof) {
  if (!(prob > 0 && prob < 1 && dof > 0)) return std::numeric_limits<double>::quiet_NaN();
  if (prob == 0.5) return 0;
  if (prob < 0.5) return -student_t_quantile(1 - prob, dof);
  double low = 0, high = 1;
  while (student_t_cdf(high, dof) < prob) {
    low = high;
    high *= 2;
  }
  // Bisection: the cdf is monotone, and 200 halvings reach the resolution of a double from any bracket.
  for (int i = 0; i < 200 && high - low > 1e-13 * high; ++i) {
    const double mid = 0.5 * (low + high);
    (student_t_cdf(mid, dof) < prob ? low : high) = mid;
  }
  return 0.5 * (low + high);
}

}  // namespace attnprobe
