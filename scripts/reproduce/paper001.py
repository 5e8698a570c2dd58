"""Yang, Qiu, Liu 2022, "Taming Fat-Tailed Noise in Federated Learning".

Sec. 5.1: f(x, xi) = 1/2 ||x||^2 + <xi, x>, m = 5 clients, fresh noise at
every local stochastic gradient (`fat_tailed_quadratic`, whose
`round_train_data` draws new xi every round and step).
  * Fig. 4 (Cauchy noise): FedAvg does not converge; FAT-Clipping-PI and
    FAT-Clipping-PR converge rapidly, PI faster than PR.
  * Fig. 5 (alpha-stable noise, alpha = 0.5, 1.0, 1.5): PI and PR converge
    more slowly as alpha increases; the differences are much smaller for PI.

The paper gives no step sizes, clip thresholds, dimension or round count
for Sec. 5.1; we use d = 10, x_0 = 1, K = 10 local steps (batch 1),
eta_L = 0.05, eta = 1 and lambda = 1 (PI clips each stochastic gradient at
lambda; PR clips the round's update eta_L * Delta at eta_L * lambda, so a
clipped round moves as far as one clipped step of PI).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow_federated as tff

import tasks
from scripts.reproduce import common
from tff_clip.aggregation import aggregators
from tff_clip.learning import algorithms

LOCAL_STEPS = 10
CLIENT_LR = 0.05
CLIP = 1.0  # lambda


def _settings(quick):
  if quick:
    return dict(seeds=[0], rounds=4, alphas=(1.0,), fig5=False)
  return dict(seeds=[0, 1, 2], rounds=40, alphas=(0.5, 1.0, 1.5), fig5=True)


def _process(task, algorithm):
  sgd = tff.learning.optimizers.build_sgdm
  kwargs = {}
  if algorithm == 'PI':
    kwargs['local_clip_norm'] = CLIP
  elif algorithm == 'PR':
    kwargs['model_aggregator'] = aggregators.clip_factory(CLIENT_LR * CLIP)
  return algorithms.build_fedavg(
      task.model_fn, client_optimizer=sgd(CLIENT_LR),
      server_optimizer=sgd(1.0), **kwargs)


def _trajectories(task, algorithms_, seeds, rounds):
  """{algorithm: array [seeds, rounds] of ||x_t||^2}."""
  out = {}
  for algorithm in algorithms_:
    process = _process(task, algorithm)
    runs = []
    for seed in seeds:
      values = []
      common.run_rounds(
          process, task, rounds, seed=seed,
          on_round=lambda r, s, o, p=process, v=values: v.append(
              task.problem.report(p.get_model_weights(s).trainable)))
      runs.append(values)
    out[algorithm] = np.asarray(runs)
  return out


def _tail_median(values, rounds):
  return float(np.median(values[rounds // 2:]))


def run(quick: bool, output_dir: str) -> common.Report:
  s = _settings(quick)
  out = os.path.join(output_dir, 'paper001')
  rounds, seeds = s['rounds'], s['seeds']
  report = common.Report(
      '001', 'Yang, Qiu, Liu, Taming fat-tailed noise in FL (FAT-Clipping)',
      scale=(f'quadratic of Sec. 5.1, d = 10, m = 5 clients, {LOCAL_STEPS} '
             f'local steps of batch 1 with fresh noise, {rounds} rounds, '
             f'seeds {seeds}; eta_L = {CLIENT_LR}, eta = 1, lambda = {CLIP} '
             '(the paper states none of these)'))
  task = tasks.get_task('fat_tailed_quadratic', examples_per_client=LOCAL_STEPS,
                        train_batch_size=1, seed=0)
  fig4 = _trajectories(task, ('FedAvg', 'PI', 'PR'), seeds, rounds)
  medians = {a: [_tail_median(v, rounds) for v in runs]
             for a, runs in fig4.items()}
  report.add_table(
      f'Fig. 4 (Cauchy): median ||x_t||^2 over rounds {rounds // 2 + 1}-'
      f'{rounds}, per seed, and the peak',
      ['algorithm'] + [f'seed {k}' for k in seeds] + ['peak (all seeds)'],
      [[a] + medians[a] + [float(fig4[a].max())] for a in fig4])
  ratio_ok = [f >= 10 * min(pi, pr) for f, pi, pr in
              zip(medians['FedAvg'], medians['PI'], medians['PR'])]
  pi_faster = [pi < pr for pi, pr in zip(medians['PI'], medians['PR'])]
  need = (len(seeds) + 1) // 2 + (len(seeds) > 1)  # 2 of 3; 1 of 1.
  need = min(need, len(seeds))
  report.claims.append(common.Claim(
      'Fig. 4: FedAvg does not converge under Cauchy noise; FAT-Clipping does',
      'FedAvg diverges; PI and PR converge rapidly',
      f'FedAvg median >= 10x the better clipping method in '
      f'{sum(ratio_ok)}/{len(seeds)} seeds',
      common.verdict_from([sum(ratio_ok) >= need]) if sum(ratio_ok) >= need
      else (common.PARTLY if any(ratio_ok) else common.NOT_REPRODUCED),
      f"FedAvg's median objective (second half) >= 10x min(PI, PR)'s on >= "
      f'{need} of {len(seeds)} seeds'))
  report.claims.append(common.Claim(
      'Fig. 4: PI converges faster than PR',
      'PI below PR',
      f'PI median < PR median in {sum(pi_faster)}/{len(seeds)} seeds',
      common.REPRODUCED if sum(pi_faster) >= need else (
          common.PARTLY if any(pi_faster) else common.NOT_REPRODUCED),
      f"PI's median objective (second half) < PR's on >= {need} of "
      f'{len(seeds)} seeds'))

  plt = common.pyplot()
  fig, axes = plt.subplots(1, 2 if s['fig5'] else 1, figsize=(
      11 if s['fig5'] else 6, 3.8), squeeze=False)
  ax = axes[0][0]
  for algorithm, runs in fig4.items():
    ax.semilogy(np.arange(1, rounds + 1), np.median(runs, axis=0),
                label=f'{algorithm} (median of {len(seeds)} seeds)')
  ax.set_xlabel('round')
  ax.set_ylabel('||x||^2')
  ax.set_title('Fig. 4: Cauchy noise')
  ax.legend()

  if s['fig5']:
    fig5 = {}
    for alpha in s['alphas']:
      task_a = tasks.get_task(
          'fat_tailed_quadratic', noise='stable', tail_index=alpha,
          examples_per_client=LOCAL_STEPS, train_batch_size=1, seed=0)
      fig5[alpha] = _trajectories(task_a, ('PI', 'PR'), seeds, rounds)
    rows = []
    for alpha, result in fig5.items():
      rows.append([alpha] + [
          common.mean_std([_tail_median(v, rounds) for v in result[a]])
          for a in ('PI', 'PR')])
    report.add_table(
        'Fig. 5 (alpha-stable): median ||x_t||^2 over the second half, mean '
        '± std over seeds', ['alpha', 'PI', 'PR'], rows)
    ax = axes[0][1]
    for alpha, result in fig5.items():
      for algorithm, style in (('PI', '-'), ('PR', '--')):
        ax.semilogy(np.arange(1, rounds + 1),
                    np.median(result[algorithm], axis=0), style,
                    label=f'{algorithm}, alpha={alpha}')
    ax.set_xlabel('round')
    ax.set_title('Fig. 5: alpha-stable noise')
    ax.legend(fontsize=7)
    # "Slower as alpha increases": the second-half median objective rises
    # with alpha, for each algorithm (means over seeds).
    level = {a: {alpha: np.mean([_tail_median(v, rounds)
                                 for v in fig5[alpha][a]])
                 for alpha in s['alphas']} for a in ('PI', 'PR')}
    monotone = {a: all(level[a][x] < level[a][y] for x, y in zip(
        s['alphas'], s['alphas'][1:])) for a in ('PI', 'PR')}
    spread = {a: max(level[a].values()) / min(level[a].values())
              for a in ('PI', 'PR')}
    report.claims.append(common.Claim(
        'Fig. 5: both converge more slowly as alpha increases',
        'objective level rises with alpha for PR and PI',
        f"PI levels {', '.join(f'{v:.3g}' for v in level['PI'].values())}; "
        f"PR levels {', '.join(f'{v:.3g}' for v in level['PR'].values())} "
        f"(alpha {', '.join(str(a) for a in s['alphas'])})",
        common.verdict_from([monotone['PI'], monotone['PR']]),
        'mean over seeds of the second-half median rises with alpha, for PI '
        'and for PR'))
    report.claims.append(common.Claim(
        'Fig. 5: the differences across alpha are smaller for PI than PR',
        'PI much less sensitive to alpha',
        f"max/min level across alpha: PI {spread['PI']:.3g}, PR "
        f"{spread['PR']:.3g}",
        common.verdict_from([spread['PI'] < spread['PR']]),
        "PI's max/min level ratio across alpha < PR's"))
  report.plots.append(common.save_figure(fig, out, 'fig4_fig5.png'))
  plt.close(fig)
  return report
