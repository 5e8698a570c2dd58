"""Das et al. 2022, "On the Convergence of Differentially Private
Federated Learning on Non-Lipschitz Objectives, and with Normalized Client
Updates".

Sec. 5.3: f_i(w) = 1/2 (w - w_i*)^T Q_i (w - w_i*), n = 100 clients, d = 200
(`heterogeneous_quadratic`), full participation, E = 20 local steps,
(epsilon, delta) = (5, 1e-6) over K = 500 rounds, eta_k = beta_k = eta,
start I1 (w* + z) and I2 (w* + z/5).
  * Normalization and clipping coincide when every update norm is >= C
    (then C u/||u|| = u min(1, C/||u||)): same updates, same noise, same
    trajectory.
  * Fig. 1: for C = 50, 100 DP-NormFedAvg reaches an appreciably lower
    f(w) - f(w*) than DP-FedAvg with clipping (C = 40: slightly lower).
  * Fig. 2: SNR = ||(1/r) sum_i g_i|| / ||(1/r) sum_i zeta_i|| is higher for
    normalization, by much more at C = 50, 100 than at C = 40.
The noise z is calibrated to the paper's budget (epsilon 5 over 500 rounds
of full participation), then fewer rounds are run; both algorithms get the
same noise seed. eta is not given for the SNR figure; we use 0.01.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from scripts.reproduce import common
from tff_clip.aggregation import bounding
from tff_clip.aggregation import dp
from tff_clip.learning import algorithms
from tff_clip.privacy import accounting

LOCAL_STEPS = 20
ETA = 0.01
PAPER_ROUNDS = 500


def _settings(quick):
  if quick:
    return dict(rounds=2, clip_norms=(40.0,), seeds=[0], num_clients=10)
  return dict(rounds=20, clip_norms=(40.0, 100.0), seeds=[0, 1],
              num_clients=100)


def _process(task, method, z, clip_norm, num_clients, noise_seed):
  sgd = tff.learning.optimizers.build_sgdm
  return algorithms.build_fedavg(
      task.model_fn, client_optimizer=sgd(ETA), server_optimizer=sgd(ETA),
      model_aggregator=dp.dp_factory(method, noise_multiplier=z,
                                     clients_per_round=float(num_clients),
                                     clip_norm=clip_norm,
                                     noise_seed=noise_seed),
      client_weighting=tff.learning.ClientWeighting.UNIFORM)


def _snr(task, weights, method, clip_norm, z, seed, round_num):
  updates = common.client_updates(
      task, weights, tff.learning.optimizers.build_sgdm(ETA), seed, round_num,
      LOCAL_STEPS)
  bound = [bounding.bound([tf.constant(u) for u in update], method,
                          clip_norm=clip_norm).value for update in updates]
  mean = [np.mean([b[i].numpy() for b in bound], axis=0)
          for i in range(len(bound[0]))]
  signal = np.sqrt(sum(float(np.sum(np.square(m))) for m in mean))
  dimension = sum(m.size for m in mean)
  # The noise on the sum is N(0, (zC)^2 I), divided by r = len(updates):
  # E||noise / r|| ~ z C sqrt(d) / r.
  noise = z * clip_norm * np.sqrt(dimension) / len(updates)
  norms = [np.sqrt(sum(float(np.sum(np.square(u))) for u in update))
           for update in updates]
  return signal / noise, float(np.min(norms)), float(np.max(norms))


def run(quick: bool, output_dir: str) -> common.Report:
  s = _settings(quick)
  out = os.path.join(output_dir, 'paper003')
  n, rounds = s['num_clients'], s['rounds']
  z = accounting.calibrate_noise_multiplier(
      5.0, clients_per_round=n, population_size=n, rounds=PAPER_ROUNDS,
      delta=1e-6)
  report = common.Report(
      '003', 'Das et al., DP FL with normalized client updates '
      '(DP-NormFedAvg)',
      scale=(f'federated quadratic of Sec. 5.3, n = {n}, d = 200, E = '
             f'{LOCAL_STEPS}, eta = beta = {ETA}, z = {z:.3g} (epsilon 5 at '
             f'delta 1e-6 over the paper\'s {PAPER_ROUNDS} rounds), {rounds} '
             f'rounds run, seeds {s["seeds"]}, init I1'))

  # Claim 1: equivalence when every norm >= C.
  task = tasks.get_task('heterogeneous_quadratic', num_clients=n,
                        train_batch_size=20, seed=0)
  small_c = 0.01
  finals = {}
  for method in ('clip', 'normalize'):
    process = _process(task, method, z, small_c, n, noise_seed=7)
    state = common.run_rounds(process, task, 2 if quick else 5, seed=0,
                              local_steps=LOCAL_STEPS)
    finals[method] = common.weights_vector(process, state)
  diff = float(np.max(np.abs(finals['clip'] - finals['normalize'])))
  report.add_table(
      f'Clip vs normalize with C = {small_c} (below every update norm)',
      ['rounds', 'max |w_clip - w_norm|'], [[2 if quick else 5, diff]])
  report.claims.append(common.Claim(
      'clip == normalize when every ||u_i|| >= C',
      'identical (C u/||u|| = u min(1, C/||u||))', f'max difference {diff:g}',
      common.verdict_from([diff <= 1e-6]), 'max |w_clip - w_norm| <= 1e-6'))

  # Claims 2-3: suboptimality and SNR for larger C.
  rows, snr_rows = [], []
  curves = {}
  wins, snr_wins = {}, {}
  for clip_norm in s['clip_norms']:
    for method in ('clip', 'normalize'):
      subopt, snrs = [], []
      for seed in s['seeds']:
        task = tasks.get_task('heterogeneous_quadratic', num_clients=n,
                              train_batch_size=20, seed=seed)
        process = _process(task, method, z, clip_norm, n, noise_seed=seed)
        values = []
        checkpoints = {1, rounds // 2, rounds}
        seed_snr = []

        def on_round(r, state, output, process=process, task=task,
                     values=values, seed_snr=seed_snr, seed=seed):
          del output
          weights = process.get_model_weights(state)
          values.append(task.problem.excess_loss(weights.trainable))
          if r in checkpoints:
            seed_snr.append(_snr(task, weights, method, clip_norm, z, seed,
                                 r + 1))
        common.run_rounds(process, task, rounds, seed=seed,
                          local_steps=LOCAL_STEPS, on_round=on_round)
        subopt.append(values)
        snrs.append(seed_snr)
      subopt = np.asarray(subopt)
      curves[(clip_norm, method)] = subopt.mean(axis=0)
      snr_mean = float(np.mean([x[0] for seed_snr in snrs for x in seed_snr]))
      norm_range = (min(x[1] for ss in snrs for x in ss),
                    max(x[2] for ss in snrs for x in ss))
      rows.append([clip_norm, method, float(subopt[:, 0].mean()),
                   float(subopt[:, -1].mean()),
                   common.mean_std(subopt[:, -1])])
      snr_rows.append([clip_norm, method, snr_mean,
                       f'{norm_range[0]:.3g}-{norm_range[1]:.3g}'])
      wins.setdefault(clip_norm, {})[method] = float(subopt[:, -1].mean())
      snr_wins.setdefault(clip_norm, {})[method] = snr_mean
  report.add_table(
      f'Fig. 1: f(w_k) - f(w*) (mean over seeds), I1',
      ['C', 'method', 'round 1', f'round {rounds}', f'round {rounds} ± std'],
      rows)
  report.add_table(
      'Fig. 2: SNR (mean over rounds 1, K/2, K and seeds) and the raw update '
      'norms seen', ['C', 'method', 'SNR', '||u_i|| range'], snr_rows)
  better = [wins[c]['normalize'] < wins[c]['clip'] for c in wins]
  report.claims.append(common.Claim(
      'Fig. 1: DP-NormFedAvg reaches lower suboptimality than clipping',
      'appreciably lower for C = 50, 100',
      '; '.join(f"C={c:g}: norm {w['normalize']:.4g} vs clip {w['clip']:.4g}"
                for c, w in wins.items()),
      common.verdict_from(better), 'final suboptimality (mean over seeds) '
      'lower for normalize, per C'))
  snr_better = [snr_wins[c]['normalize'] > snr_wins[c]['clip']
                for c in snr_wins]
  report.claims.append(common.Claim(
      'Fig. 2: normalization has the higher SNR',
      'higher, by more for larger C',
      '; '.join(f"C={c:g}: norm {w['normalize']:.3g} vs clip {w['clip']:.3g}"
                for c, w in snr_wins.items()),
      common.verdict_from(snr_better), 'mean SNR higher for normalize, per C'))
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.8))
  for (clip_norm, method), curve in curves.items():
    ax.semilogy(np.arange(1, rounds + 1), curve,
                '-' if method == 'normalize' else '--',
                label=f'{"Norm" if method == "normalize" else "Clip"}, '
                f'C={clip_norm:g}')
  ax.set_xlabel('round')
  ax.set_ylabel('f(w) - f(w*)')
  ax.set_title(f'Das et al. 2022, Fig. 1 (I1, eta = {ETA})')
  ax.legend()
  report.plots.append(common.save_figure(fig, out, 'fig1.png'))
  plt.close(fig)
  return report
