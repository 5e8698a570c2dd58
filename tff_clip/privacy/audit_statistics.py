"""The audit's statistics: epsilon estimates and one-run lower bounds.

Numpy and scipy only; the canaries that produce the statistics are in
`tff_clip.privacy.audit`.

1. The estimate (Andrew et al., "One-shot Empirical Privacy Estimation for
   Federated Learning", ICLR 2024, Alg. 2, last line): fit N(mu_0, s^2) to
   the statistics of the never-inserted candidates and N(mu_1, s^2) to the
   inserted ones (pooled s: see `estimate_epsilon`), and report the epsilon
   at the run's delta of the pair of Gaussians, eps(delta) = inf{eps :
   H_{e^eps}(P||Q) <= delta and H_{e^eps}(Q||P) <= delta} with the
   hockey-stick divergence H_a(P||Q) = P[L > log a] - a Q[L > log a],
   L = log dP/dQ (Balle and Wang, ICML 2018, Thm. 5 for equal variances;
   computed exactly here for unequal ones: the privacy loss of two
   Gaussians is a quadratic in x). For equal variances this is the epsilon
   of the Gaussian mechanism with mu = (mu_1 - mu_0)/s. It is an ESTIMATE
   (Andrew et al. prove it consistent for the Gaussian mechanism in high
   dimension), not a bound.

2. The lower bound (Steinke, Nasr, Jagielski, "Privacy Auditing with One
   (1) Training Run", NeurIPS 2023, Thm. 5.2): guess "inserted" for the r
   candidates with the highest statistic and abstain on the rest; if the
   run is (eps, delta)-DP with respect to each canary, the number V of
   correct guesses satisfies
       P[V >= v] <= P[Binomial(r, e^eps/(1+e^eps)) >= v]
                    + 2 m delta max_{i=1..v} P[v-i <= Binomial(r, .) < v] / i.
   The reported bound is the largest eps whose p-value is below beta / G,
   G the number of (statistic, r) tests tried (Bonferroni), so with
   probability >= 1 - beta (the stated confidence) the run is NOT
   (eps_lower, delta)-DP for any eps < eps_lower -- a correct mechanism
   therefore keeps eps_lower below the ledger's epsilon with that
   probability.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Sequence

import numpy as np
from scipy import optimize
from scipy import stats

from tff_clip import checks

__all__ = ['DEFAULT_CONFIDENCE', 'GUESS_FRACTIONS', 'estimate_epsilon',
           'estimate_range', 'gaussian_pair_epsilon', 'one_run_lower_bound',
           'one_run_p_value', 'threat_summary']

DEFAULT_CONFIDENCE = 0.95
# Fractions of the m candidates guessed "inserted" (top scores): a fixed,
# pre-declared grid, Bonferroni-corrected.
GUESS_FRACTIONS = (0.05, 0.1, 0.2, 0.35)
_EPSILON_CAP = 1e3


# ----------------------------------------------------------------------------
# Epsilon of a pair of Gaussians (the estimate).


def _log_ratio_region(p, q, log_a):
  """The set {x : log p(x)/q(x) > log_a} as a list of (lo, hi) intervals.

  p, q: (mean, std) of two Gaussians. log p - log q = A x^2 + B x + c0.
  """
  (m0, s0), (m1, s1) = p, q
  a = 0.5 / s1**2 - 0.5 / s0**2
  b = m0 / s0**2 - m1 / s1**2
  c = math.log(s1 / s0) - 0.5 * m0**2 / s0**2 + 0.5 * m1**2 / s1**2 - log_a
  if abs(a) < 1e-12 * (abs(b) + 1e-300) or a == 0.0:
    if b == 0:
      return [(-math.inf, math.inf)] if c > 0 else []
    root = -c / b
    return [(root, math.inf)] if b > 0 else [(-math.inf, root)]
  disc = b * b - 4 * a * c
  if disc <= 0:
    return [(-math.inf, math.inf)] if a > 0 else []
  sq = math.sqrt(disc)
  lo, hi = sorted(((-b - sq) / (2 * a), (-b + sq) / (2 * a)))
  if a > 0:
    return [(-math.inf, lo), (hi, math.inf)]
  return [(lo, hi)]


def _mass(dist, intervals):
  mean, std = dist
  total = 0.0
  for lo, hi in intervals:
    # Tail-accurate: sf for the upper part, cdf for the lower.
    upper = stats.norm.sf(lo, mean, std) if lo > -math.inf else 1.0
    beyond = stats.norm.sf(hi, mean, std) if hi < math.inf else 0.0
    total += max(upper - beyond, 0.0)
  return total


def _hockey_stick(p, q, epsilon):
  """H_{e^eps}(P||Q) = P[S] - e^eps Q[S], S = {log dP/dQ > eps}."""
  region = _log_ratio_region(p, q, epsilon)
  return max(_mass(p, region) - math.exp(epsilon) * _mass(q, region), 0.0)


def gaussian_pair_epsilon(null_mean: float, null_std: float,
                          observed_mean: float, observed_std: float,
                          delta: float) -> float:
  """The smallest eps with both hockey-stick divergences <= delta.

  eps(delta) of distinguishing N(null_mean, null_std^2) from
  N(observed_mean, observed_std^2) (Andrew et al. 2024, Alg. 2; Balle and
  Wang 2018, Thm. 5 in the equal-variance case). Returns `inf` when even a
  huge eps leaves more than delta.
  """
  delta = checks.probability(delta, 'delta')
  for value, label in ((null_std, 'null_std'), (observed_std, 'observed_std')):
    checks.positive_float(value, label, np.float64)
  p = (float(null_mean), float(null_std))
  q = (float(observed_mean), float(observed_std))

  def excess(epsilon):
    return max(_hockey_stick(p, q, epsilon), _hockey_stick(q, p, epsilon)) - delta

  if excess(0.0) <= 0:
    return 0.0
  hi = 1.0
  while excess(hi) > 0:
    hi *= 2
    if hi > _EPSILON_CAP:
      return math.inf
  return float(optimize.brentq(excess, 0.0, hi, xtol=1e-6, rtol=1e-9))


def estimate_epsilon(observed: Sequence[float], unobserved: Sequence[float],
                     delta: float) -> float:
  """Andrew et al.'s estimate: Gaussian fits of the two statistics' samples.

  `observed`: the statistic of the inserted canaries; `unobserved`: of the
  never-inserted ones. Fits N(mu_1, s^2) and N(mu_0, s^2) with the sample
  means and the POOLED (ddof=2) standard deviation, and returns
  `gaussian_pair_epsilon` of the fits, i.e. the epsilon of a Gaussian
  mechanism with mu = |mu_1 - mu_0| / s (Balle and Wang 2018, Thm. 8).

  Why one variance: Andrew et al. (Thm. 3.2) show that in high dimension an
  inserted canary's cosine is the null's N(0, 1/d) shifted, same variance.
  Fitting two variances instead makes the estimate at small delta hinge on
  the sampling error of their ratio (the privacy loss of two Gaussians with
  different variances is quadratic): with 400 candidates and z = 2 it read
  3.1 for an analytic 2.0. `inf` if the groups are separated with zero
  spread; nan with fewer than 2 samples in a group.
  """
  observed = np.asarray(observed, np.float64)
  unobserved = np.asarray(unobserved, np.float64)
  if observed.size < 2 or unobserved.size < 2:
    return math.nan
  if not (np.all(np.isfinite(observed)) and np.all(np.isfinite(unobserved))):
    return math.inf
  m1, m0 = observed.mean(), unobserved.mean()
  pooled = math.sqrt((((observed - m1)**2).sum() +
                      ((unobserved - m0)**2).sum()) /
                     (observed.size + unobserved.size - 2))
  if pooled <= 0:
    return 0.0 if m0 == m1 else math.inf
  return gaussian_pair_epsilon(m0, pooled, m1, pooled, delta)


def estimate_range(observed_mean: float, observed_std: float,
                   num_observed: int, null_mean: float, null_std: float,
                   num_null: int, delta: float,
                   z_score: float = 1.96) -> tuple[float, float]:
  """An approximate 95% range of the estimate from its sampling error.

  mu = |mu_1 - mu_0| / s (pooled s) has standard error about
  sqrt(1/n_1 + 1/n_0); the range is the epsilons at mu -/+ 1.96 of it
  (the error of s itself ignored). It says how far the estimate moves with
  the canaries drawn, nothing more: it is not a confidence interval for the
  run's true epsilon, and neither end is a bound.
  """
  pooled = math.sqrt(((num_observed - 1) * observed_std**2 +
                      (num_null - 1) * null_std**2) /
                     (num_observed + num_null - 2))
  mu = abs(observed_mean - null_mean) / pooled
  error = z_score * math.sqrt(1 / num_observed + 1 / num_null)
  at = lambda m: (0.0 if m <= 0 else
                  gaussian_pair_epsilon(0.0, 1.0, m, 1.0, delta))
  return at(mu - error), at(mu + error)


# ----------------------------------------------------------------------------
# One-run lower bound (Steinke, Nasr, Jagielski 2023).


def one_run_p_value(num_candidates: int, num_guesses: int, num_correct: int,
                    epsilon: float, delta: float) -> float:
  """P[>= num_correct correct of num_guesses] under (eps, delta)-DP.

  Steinke, Nasr, Jagielski 2023, Thm. 5.2 (m = num_candidates, each included
  independently with probability 1/2; r guesses; v correct).
  """
  m, r, v = int(num_candidates), int(num_guesses), int(num_correct)
  if not 0 <= v <= r <= m:
    raise ValueError(f'Need 0 <= num_correct <= num_guesses <= num_candidates;'
                     f' got {v}, {r}, {m}.')
  p = 1.0 / (1.0 + math.exp(-epsilon))
  tail = stats.binom.sf(v - 1, r, p)
  if v == 0 or delta == 0:
    return min(tail, 1.0)
  # window_i = P[v - i <= Binomial(r, p) < v], i = 1..v.
  window = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, p))
  best = float(np.max(window / np.arange(1, v + 1)))
  return min(tail + 2.0 * m * delta * best, 1.0)


def _lower_bound_for(m, r, v, delta, alpha):
  """Largest eps with p-value < alpha (0 if even eps = 0 is not rejected)."""
  if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
    return 0.0
  lo, hi = 0.0, 1.0
  while one_run_p_value(m, r, v, hi, delta) < alpha:
    lo, hi = hi, 2 * hi
    if hi > 200:
      return lo
  for _ in range(50):
    mid = 0.5 * (lo + hi)
    if one_run_p_value(m, r, v, mid, delta) < alpha:
      lo = mid
    else:
      hi = mid
  return lo


def one_run_lower_bound(scores: Sequence[Sequence[float]],
                        inserted: Sequence[bool], delta: float,
                        confidence: float = DEFAULT_CONFIDENCE,
                        guess_fractions: Sequence[float] = GUESS_FRACTIONS
                        ) -> dict[str, Any]:
  """Epsilon lower bound at `confidence` from one or more statistics.

  For every statistic in `scores` (each one value per candidate) and every
  r = round(f m) for f in `guess_fractions`, guess "inserted" for the r
  highest scores; the bound is the largest per-test bound at level
  (1 - confidence) / G, G the number of tests (Bonferroni), so the whole
  procedure holds at `confidence`.
  """
  checks.probability(confidence, 'confidence')
  inserted = np.asarray(inserted, bool)
  m = inserted.size
  scores = [np.asarray(s, np.float64) for s in scores]
  counts = sorted({min(m, max(1, int(round(f * m)))) for f in guess_fractions})
  tests = len(scores) * len(counts)
  alpha = (1.0 - confidence) / tests
  best = {'epsilon': 0.0, 'guesses': 0, 'correct': 0}
  for score in scores:
    # Non-finite scores (a blown-up model) rank first: they are guesses too.
    order = np.argsort(-np.nan_to_num(score, nan=np.inf), kind='stable')
    for r in counts:
      v = int(inserted[order[:r]].sum())
      epsilon = _lower_bound_for(m, r, v, delta, alpha)
      if epsilon > best['epsilon']:
        best = {'epsilon': epsilon, 'guesses': r, 'correct': v}
  best['confidence'] = confidence
  best['tests'] = tests
  return best


def _summarise(observed, unobserved, delta):
  return collections.OrderedDict(
      epsilon=estimate_epsilon(observed, unobserved, delta),
      inserted_mean=float(np.mean(observed)) if len(observed) else math.nan,
      inserted_std=float(np.std(observed, ddof=1)) if len(observed) > 1
      else math.nan,
      null_mean=float(np.mean(unobserved)) if len(unobserved) else math.nan,
      null_std=float(np.std(unobserved, ddof=1)) if len(unobserved) > 1
      else math.nan)


def threat_summary(statistics, inserted, delta: float,
                   confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
  """One threat model's estimate and lower bound from its statistics.

  `statistics`: one value per candidate each (the threat model's test
  statistics); `inserted`: the candidates' coins. The estimate is the
  largest of the statistics' (`estimate_epsilon`, with `estimate_range`);
  the lower bound covers all of them at `confidence`
  (`one_run_lower_bound`).
  """
  inserted = np.asarray(inserted, bool)
  fits = [_summarise(s[inserted], s[~inserted], delta) for s in statistics]
  best = max(fits, key=lambda f: -1 if math.isnan(f['epsilon'])
             else f['epsilon'])
  bound = one_run_lower_bound(statistics, inserted, delta, confidence)
  out = collections.OrderedDict(estimate=best['epsilon'])
  if math.isfinite(best['epsilon']) and best['inserted_std'] > 0:
    out['estimate_range'] = list(estimate_range(
        best['inserted_mean'], best['inserted_std'], int(inserted.sum()),
        best['null_mean'], best['null_std'], int((~inserted).sum()), delta))
  out['lower_bound'] = bound['epsilon']
  out.update((k, v) for k, v in best.items() if k != 'epsilon')
  out['lower_bound_guesses'] = bound['guesses']
  out['lower_bound_tests'] = bound['tests']
  out['lower_bound_correct'] = bound['correct']
  return out
