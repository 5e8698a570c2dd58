"""Pelikan et al. 2025, "Enabling Differentially Private Federated
Learning for Speech Recognition" (NeurIPS 2025).

Claims checked:
  * Table 1, the accountant columns: epsilon at delta = 1e-9 (RDP, moments
    accountant, Poisson sampling of S of K clients, T rounds, z = sigma_DP S)
    for all 19 private rows, including the extrapolated populations.
  * Table 1 / Sec. 4.3: at equal epsilon, per-layer clipping ("uniform"
    C/sqrt(H), "dim" C sqrt(d_h/sum d)) beats global clipping, and "dim"
    beats "uniform" by ~1 WER point.
  * Sec. 4 / App. G.4: LAMB on the server is the most robust choice
    (compared with SGD and Adam).
The training claims are checked on federated scikit-learn digits (real
8x8 handwriting, MLP 64-32-10, 100 clients Dirichlet(0.5), 20 clients per
round, z = 1) -- the paper trains a 250M-parameter transformer on Common
Voice, which this machine cannot.
"""

from __future__ import annotations

import os

import numpy as np

from scripts.reproduce import common
from tff_clip.privacy import accounting

# z, S, K, T, paper's epsilon (RDP, delta = 1e-9), paper's RDP order.
TABLE1 = (
    (0.03072, 1024, 34_753, 2006, 1.1e6, 1.1),
    (0.3072, 10_240, 347_530, 2006, 3.7e2, 1.1),
    (1.536, 51_200, 1_737_650, 2006, 6.5, 7.0),
    (0.02048, 1024, 34_753, 2006, 2.6e6, 1.1),
    (1.024, 51_200, 1_737_650, 2006, 1.3, 4.0),
    (2.048, 102_400, 3_475_300, 2006, 4.5, 9.0),
    (0.01024, 1024, 34_753, 2006, 1.1e7, 1.1),
    (0.512, 51_200, 1_737_650, 2006, 7.2e1, 1.5),
    (1.024, 102_400, 3_475_300, 2006, 1.3e1, 4.0),
    (2.048, 204_800, 6_950_600, 2006, 4.5, 9.0),
    (0.003072, 1024, 34_753, 2006, 1.2e8, 1.1),
    (0.3072, 102_400, 3_475_300, 2006, 3.7e2, 1.1),
    (0.6144, 204_800, 6_950_600, 2006, 4.2e1, 2.0),
    (0.6144, 204_800, 69_506_000, 2034, 7.2, 3.0),
    (0.6144, 204_800, 695_060_000, 3390, 3.7, 6.0),
    (0.001024, 1024, 34_753, 2006, 1.1e9, 1.1),
    (0.2048, 204_800, 6_950_600, 2006, 1.1e3, 1.1),
    (0.2048, 204_800, 69_506_000, 2034, 2.7e2, 1.1),
    (0.2048, 204_800, 695_060_000, 3390, 9.4e1, 1.3),
)
DELTA = 1e-9


def _two_digits(value: float) -> float:
  return float(f'{value:.2g}')


def table1(report, quick):
  rows_in = TABLE1[:3] if quick else TABLE1
  rows, passed = [], []
  for z, cohort, population, rounds, paper_eps, paper_order in rows_in:
    guarantee = accounting.compute_training_epsilon(
        z, cohort, population, rounds, DELTA, accountant='rdp')
    ok = _two_digits(guarantee.epsilon) == _two_digits(paper_eps)
    passed.append(ok)
    rows.append([z, cohort, population, f'{cohort / population:.3g}', rounds,
                 f'{paper_eps:.2g}', f'{guarantee.epsilon:.4g}',
                 paper_order, f'{guarantee.rdp_order:.3g}'
                 if guarantee.rdp_order is not None else '-',
                 'yes' if ok else 'NO'])
  report.add_table(
      'Table 1, accountant columns (delta = 1e-9, Poisson, RDP)',
      ['z', 'S', 'K', 'q', 'T', 'paper eps', 'ours eps', 'paper order',
       'ours order', 'same to 2 digits'], rows)
  report.claims.append(common.Claim(
      'Table 1: epsilon of every private row', '19 epsilons, 2 digits',
      f'{sum(passed)}/{len(passed)} equal to 2 significant digits',
      common.verdict_from(passed) if all(passed) or not any(passed) else (
          common.PARTLY),
      "ours rounded to 2 significant digits equals the paper's"))


ARMS = (
    # name, bounding, split, server optimizer, server lr
    ('global clip, SGDm', 'clip', 'dim', 'sgdm', 1.0),
    ('per-layer uniform, SGDm', 'per_layer_clip', 'uniform', 'sgdm', 1.0),
    ('per-layer dim, SGDm', 'per_layer_clip', 'dim', 'sgdm', 1.0),
    ('per-layer dim, Adam', 'per_layer_clip', 'dim', 'adam', 0.01),
    ('per-layer dim, LAMB', 'per_layer_clip', 'dim', 'lamb', 0.01),
)


def training_claims(report, quick, output_dir):
  seeds = [0] if quick else [0, 1]
  rounds = 2 if quick else 20
  arms = ARMS[:2] if quick else ARMS
  base = dict(task='digits', num_clients=100, partition='dirichlet',
              partition_alpha=0.5, clip_norm=1.0, noise_multiplier=1.0,
              clients_per_round=20, sampling='poisson', rounds=rounds,
              client_learning_rate=0.1, batch_size=16, server_momentum=0.9,
              eval_every=max(1, rounds // 6))
  accuracy = {a[0]: [] for a in arms}
  epsilon = {a[0]: [] for a in arms}
  curves = {a[0]: [] for a in arms}
  for seed in seeds:
    for name, bounding, split, server, lr in arms:
      tag = name.replace(', ', '_').replace(' ', '_')
      summary = common.train(
          output_dir, f'{tag}_seed{seed}', seed=seed, bounding=bounding,
          split=split, server_optimizer=server, server_learning_rate=lr,
          **base)
      accuracy[name].append(summary['final_eval_accuracy'])
      epsilon[name].append(summary['epsilon'])
      curves[name].append(summary['metrics'])
  rows = [[name, common.mean_std(accuracy[name]),
           common.fmt(float(np.mean(epsilon[name])))] for name, *_ in arms]
  report.add_table(
      f'Equal-epsilon comparison on digits ({rounds} rounds, z = 1, 20 of '
      f'100 clients, C = 1; final accuracy mean ± std over seeds {seeds})',
      ['arm', 'accuracy', 'epsilon'], rows)
  eps_equal = all(np.allclose(epsilon[n], epsilon[arms[0][0]], rtol=1e-9)
                  for n, *_ in arms)
  mean = {n: float(np.mean(v)) for n, v in accuracy.items()}
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.8))
  for name, runs in curves.items():
    points = [(r, a) for r, a in zip(runs[0]['round'], runs[0]['eval_accuracy'])
              if np.isfinite(a)]
    ax.plot(*zip(*points), marker='o', label=name)
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy (seed 0)')
  ax.set_title('Pelikan et al. 2025 on digits, equal epsilon')
  ax.legend(fontsize=7)
  report.plots.append(common.save_figure(fig, output_dir, 'per_layer_lamb.png'))
  plt.close(fig)
  if quick:
    report.claims.append(common.Claim(
        'per-layer vs global (quick: two arms only)', '-',
        f"{mean[arms[1][0]]:.3f} vs {mean[arms[0][0]]:.3f}",
        common.verdict_from([eps_equal and mean[arms[1][0]] > mean[arms[0][0]]]),
        'per-layer uniform above global clip'))
    return
  global_, uniform, dim = (mean['global clip, SGDm'],
                           mean['per-layer uniform, SGDm'],
                           mean['per-layer dim, SGDm'])
  report.claims.append(common.Claim(
      'Sec. 4.3: per-layer clipping beats global clipping at equal epsilon',
      'WER 23.7-27.0 (global) -> 17.9-21.3 (per-layer)',
      f'global {global_:.3f}, uniform {uniform:.3f}, dim {dim:.3f} '
      f'(epsilon equal: {eps_equal})',
      common.verdict_from([eps_equal and uniform > global_,
                           eps_equal and dim > global_]),
      'mean accuracy over seeds: uniform > global and dim > global'))
  report.claims.append(common.Claim(
      "Table 1: 'dim' beats 'uniform'", '~1 WER point better',
      f'dim - uniform = {100 * (dim - uniform):+.2f} points',
      common.verdict_from([eps_equal and dim > uniform]),
      'mean accuracy: dim > uniform'))
  lamb, adam = mean['per-layer dim, LAMB'], mean['per-layer dim, Adam']
  report.claims.append(common.Claim(
      'App. G.4: LAMB is the most robust server optimizer',
      'LAMB best of SGD / Adam / LAMB',
      f'LAMB {lamb:.3f}, Adam {adam:.3f}, SGDm {dim:.3f} (server lrs 0.01, '
      '0.01, 1.0, not tuned)',
      common.verdict_from([lamb >= adam, lamb >= dim]),
      'mean accuracy: LAMB >= Adam and LAMB >= SGDm'))


def run(quick: bool, output_dir: str) -> common.Report:
  out = os.path.join(output_dir, 'paper002')
  report = common.Report(
      '002', 'Pelikan et al., DP FL for speech recognition (NeurIPS 2025)',
      scale=('accountant: the paper\'s exact parameters; training: digits '
             '(1,797 real 8x8 images, MLP 64-32-10) instead of a 250M '
             'transformer on Common Voice'))
  table1(report, quick)
  training_claims(report, quick, out)
  return report
