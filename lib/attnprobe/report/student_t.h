#pragma once
// Student's t distribution, for the 95% intervals of a mean over a few replicates (heads, trials): with four heads
// the normal 1.96 is 37% too narrow (t(0.975, 3) = 3.182).
namespace attnprobe {

/// P(T <= t) for T ~ Student t with `dof` > 0 degrees of freedom (from the regularized incomplete beta function).
double student_t_cdf(double t, double dof);

/// The quantile t with P(T <= t) = prob, prob in (0, 1), dof > 0; NaN otherwise. Exact to ~1e-10 up to a thousand
/// dof (t(0.975, 1) = 12.7062, t(0.975, 3) = 3.18245); beyond a million the beta function's digits thin out (1.5e-7
/// relative at 1e9 dof), far below what an interval's half-width needs.
double student_t_quantile(double prob, double dof);

}  // namespace attnprobe
