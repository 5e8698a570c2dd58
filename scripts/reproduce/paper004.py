"""Cheng et al. 2022, "Differentially Private Federated Learning with
Local Regularization and Sparsification" (CVPR 2022).

Claim (Table 1, Sec. 7): DP-FedAvg + BLUR + LUS beats vanilla DP-FedAvg at
the same epsilon on EMNIST with the 2-layer CNN, by 2.7-4.8 points
(74.48 vs 69.65 at epsilon 2, ..., 78.09 vs 75.36 at epsilon 8), with the
defaults lambda = 0.4, c = 0.7 (Table 3: LUS alone +0.3-1.5, BLUR + LUS
+2.0-4.1 on ResNet-18).

Here: the same CNN (TFF's `cnn_dropout`, 1.2M parameters) on real 28x28
MNIST digits offline (`offline_data='mnist'`, 5,000 images, 50 clients,
Dirichlet(1.0) labels), the same z, cohort, rounds and clip norm S for every
arm -- hence the same epsilon, read from each run's ledger -- and a small
lambda x c grid. All arms of one seed share data split, initial model,
cohorts and noise seed, so differences are paired.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
from scipy import stats

from scripts.reproduce import common

PAPER_GAINS = {2.0: (69.65, 74.48), 4.0: (72.32, 75.85), 6.0: (74.12, 77.48),
               8.0: (75.36, 78.09)}


def _settings(quick: bool) -> dict:
  if quick:
    return dict(task='emnist_logreg', seeds=[0], grid_seeds=[0], rounds=2,
                grid=[(0.4, 0.7)],
                clients_per_round=5, local_steps=2, noise_multiplier=0.02)
  # The default (0.4, 0.7) and DP-FedAvg on 5 seeds; the rest of the grid on
  # the first 2 (what the machine allowed in the time).
  return dict(task='emnist_cnn', seeds=[0, 1, 2, 3, 4], grid_seeds=[0, 1],
              rounds=15,
              grid=list(itertools.product((0.4, 0.8), (0.5, 0.7))),
              clients_per_round=10, local_steps=8, noise_multiplier=0.03)


# S. With z = 0.03 and 10 clients the noise on the mean has norm
# z S sqrt(d) / n = 1.6 for S = 0.5 and d = 1.2M: the noise-limited regime
# where the paper says BLUR + LUS help (a probe without noise reached 36% at
# round 10, with z = 0.01 41%).
CLIP_NORM = 0.5
CLIENT_LR = 0.1


def run(quick: bool, output_dir: str) -> common.Report:
  s = _settings(quick)
  out = os.path.join(output_dir, 'paper004')
  base = dict(
      task=s['task'], task_options=(('offline_data', 'mnist'),),
      num_clients=50, partition='dirichlet', partition_alpha=1.0,
      bounding='clip', clip_norm=CLIP_NORM,
      noise_multiplier=s['noise_multiplier'],
      clients_per_round=s['clients_per_round'], sampling='poisson',
      rounds=s['rounds'], client_learning_rate=CLIENT_LR,
      local_steps=s['local_steps'], batch_size=16, server_optimizer='sgd',
      server_learning_rate=1.0, eval_every=s['rounds'], delta=1e-5)
  arms = [('DP-FedAvg', {})] + [
      (f'BLUR {lam:g} + LUS {c:g}',
       dict(blur_strength=lam, blur_clip_norm=CLIP_NORM, lus_sparsity=c))
      for lam, c in s['grid']]
  accuracy = {name: [] for name, _ in arms}
  epsilon = {name: [] for name, _ in arms}
  default_name = 'BLUR 0.4 + LUS 0.7'
  for seed in s['seeds']:
    for name, extra in arms:
      if (seed not in s['grid_seeds'] and
          name not in ('DP-FedAvg', default_name)):
        continue
      tag = name.replace(' ', '_').replace('+', 'p')
      summary = common.train(out, f'{tag}_seed{seed}', seed=seed,
                             **base, **extra)
      accuracy[name].append(summary['final_eval_accuracy'])
      epsilon[name].append(summary['epsilon'])

  report = common.Report(
      '004', 'Cheng et al., DP-FL with local regularization and '
      'sparsification (BLUR + LUS)',
      scale=(f"{s['task']} on 5,000 real MNIST 28x28 digits, 50 clients "
             f"Dirichlet(1.0), {s['clients_per_round']} clients/round "
             f"(Poisson), {s['rounds']} rounds, {s['local_steps']} local "
             f"steps of batch 16, client lr {CLIENT_LR}, S = {CLIP_NORM}, "
             f"z = {s['noise_multiplier']}, seeds {s['seeds']} (grid: "
             f"{s['grid_seeds']}) (paper: "
             'EMNIST-62 3,400 writers, 136 clients/round, 1,000 rounds, 30 '
             'local steps, z from epsilon 2-8)'))
  full_baseline = np.asarray(accuracy['DP-FedAvg'])
  rows = []
  best_name, best_gain = None, -np.inf
  for name, _ in arms:
    acc = np.asarray(accuracy[name])
    baseline = full_baseline[:len(acc)]  # Paired: the same seeds.
    gain = acc - baseline
    wins = int(np.sum(gain > 0))
    if name != 'DP-FedAvg' and gain.mean() > best_gain:
      best_name, best_gain = name, gain.mean()
    rows.append([name, common.mean_std(acc), common.mean_std(gain * 100),
                 f'{wins}/{len(acc)}', common.fmt(float(np.mean(epsilon[name])))])
  report.add_table(
      'Final test accuracy, gain over DP-FedAvg in points (paired by seed), '
      'epsilon from each ledger',
      ['arm', 'accuracy', 'gain (points)', 'seeds ahead', 'epsilon'], rows)
  report.add_table(
      "Paper's Table 1 (EMNIST, CNN-2-Layers)",
      ['epsilon', 'DP-FedAvg', 'BLUR + LUS', 'gain'],
      [[e, a, b, f'+{b - a:.2f}'] for e, (a, b) in PAPER_GAINS.items()])

  eps_equal = all(np.allclose(epsilon[n],
                              epsilon['DP-FedAvg'][:len(epsilon[n])],
                              rtol=1e-9) for n, _ in arms)
  default = default_name
  baseline = full_baseline
  gain = np.asarray(accuracy[default]) - baseline
  p_value = (stats.ttest_rel(accuracy[default], baseline,
                             alternative='greater').pvalue
             if len(baseline) > 1 else float('nan'))
  # Equal epsilon is a precondition of the comparison, not evidence for it.
  checks = ([gain.mean() > 0,
             len(gain) > 1 and p_value < 0.05 and gain.mean() * 100 >= 1.0]
            if eps_equal else [False])
  report.claims.append(common.Claim(
      'Table 1: BLUR + LUS (lambda 0.4, c 0.7) beats DP-FedAvg at equal '
      'epsilon',
      'CNN: +2.7 to +4.8 points (epsilon 2-8)',
      f'{gain.mean() * 100:+.2f} points mean over {len(gain)} seeds '
      f'(ahead in {int(np.sum(gain > 0))}; one-sided paired t-test p = '
      f'{p_value:.3g}); epsilon equal: {eps_equal}',
      common.verdict_from(checks),
      'precondition: epsilons equal; then mean paired gain > 0, and gain '
      '>= 1 point with paired t-test p < 0.05 (both: reproduced; one: '
      'partly)'))
  grid_gains = {n: np.mean(np.asarray(accuracy[n]) -
                           full_baseline[:len(accuracy[n])]) * 100
                for n, _ in arms if n != 'DP-FedAvg'}
  ahead = sum(g > 0 for g in grid_gains.values())
  report.claims.append(common.Claim(
      'Sec. 6: a lambda/c grid search finds a setting that beats DP-FedAvg '
      f"(grid on seeds {s['grid_seeds']})",
      'best grid setting +3-4 points',
      f'best {best_name}: {best_gain * 100:+.2f} points; {ahead} of '
      f'{len(grid_gains)} grid settings ahead on average',
      common.verdict_from([best_gain * 100 >= 1.0, ahead == len(grid_gains)]),
      'best setting >= 1 point ahead on average; every grid setting ahead'))
  return report
