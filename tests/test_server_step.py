"""Specifications of the damped server step (`server_step.oscillation_damped`)
and of `--server_step`, the default that applies it.

Oracles: the closed form of gradient descent on a quadratic (a step of
learning rate eta on f(w) = L ||w||^2 / 2 multiplies w by 1 - eta L, so it
diverges when eta L > 2 and its gradients then alternate in sign), the
distribution of the cosine of independent Gaussian vectors (N(0, 1/d)), and
TFF's own `build_sgdm`, which the damped step must equal wherever it never
detects an oscillation.
"""

import collections
import json
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.learning import server_step

_D = 100  # Large enough that an alternating gradient crosses the limit.


def _spec(d=_D):
  return [tf.TensorSpec([d], tf.float32)]


def _quadratic_run(optimizer, curvature, rounds, d=_D):
  """Gradient descent on L ||w||^2 / 2 from w = 1: the norms of w, and the
  final state."""
  state = optimizer.initialize(_spec(d))
  weights = [tf.ones([d])]
  norms = []
  for _ in range(rounds):
    gradients = [curvature * weights[0]]
    state, weights = optimizer.next(state, weights, gradients)
    norms.append(float(tf.norm(weights[0])))
  return norms, state


def test_a_step_too_long_for_the_loss_is_halved_until_descent_resumes():
  # eta L = 3: plain gradient descent multiplies w by -2 every step.
  plain, _ = _quadratic_run(tff.learning.optimizers.build_sgdm(1.0), 3.0, 12)
  assert plain[-1] == pytest.approx(10.0 * 2.0**12, rel=1e-5)
  damped, state = _quadratic_run(
      server_step.oscillation_damped(tff.learning.optimizers.build_sgdm(1.0)),
      3.0, 40)
  # One halving gives eta L = 1.5: w still changes sign every step (factor
  # -0.5), so a second one follows; at eta L = 0.75 (factor 0.25) the
  # gradients agree and the step stays.
  assert float(state['learning_rate_scale']) == 0.25
  assert damped[-1] < 1e-6 * damped[0]
  # The given learning rate is kept as the hyperparameter.
  assert float(state['learning_rate']) == 1.0


def test_the_first_halving_comes_when_the_average_crosses_three_deviations():
  # Alternating gradients: cosine 0 in round 1 (no previous update), then
  # -1; the average 0.8 a + 0.2 c is -0.2 after round 2, below the limit
  # -3 sqrt(0.2 / 1.8 / 100) = -0.1; with d = 10,000 the limit is -0.01.
  optimizer = server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(1.0))
  _, state = _quadratic_run(optimizer, 3.0, 1)
  assert float(state['learning_rate_scale']) == 1.0
  _, state = _quadratic_run(optimizer, 3.0, 2)
  assert float(state['learning_rate_scale']) == 0.5
  assert float(state['cosine_average']) == 0.0  # Restarted.
  # With d = 1 no average of cosines in [-1, 1] can cross -3 sqrt(1/9) = -1:
  # a one-dimensional update is never evidence against noise.
  _, state = _quadratic_run(optimizer, 3.0, 30, d=1)
  assert float(state['learning_rate_scale']) == 1.0


def test_noise_alone_keeps_the_learning_rate():
  # 500 rounds of independent Gaussian updates (a DP aggregate that is all
  # noise), d = 1,000: cosines ~ N(0, 1/d), the average never 3 deviations
  # below zero. A limit at zero would halve about every other round.
  rng = np.random.default_rng(7)
  optimizer = server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(0.1, momentum=0.9))
  state = optimizer.initialize(_spec(1000))
  weights = [tf.zeros([1000])]
  averages = []
  for _ in range(500):
    gradient = [tf.constant(rng.normal(size=1000), tf.float32)]
    state, weights = optimizer.next(state, weights, gradient)
    averages.append(float(state['cosine_average']))
  assert float(state['learning_rate_scale']) == 1.0
  # The averages have the null's spread: sqrt(0.2 / 1.8 / 1000) = 0.0105.
  assert np.std(averages[50:]) == pytest.approx(0.0105, rel=0.25)


def test_without_oscillation_it_is_tffs_sgdm_step_for_step():
  rng = np.random.default_rng(3)
  direction = rng.normal(size=20).astype(np.float32)
  damped = server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(0.5, momentum=0.9))
  plain = tff.learning.optimizers.build_sgdm(0.5, momentum=0.9)
  spec = _spec(20)
  s_damped, s_plain = damped.initialize(spec), plain.initialize(spec)
  w_damped = w_plain = [tf.zeros([20])]
  for _ in range(15):
    # Positively correlated updates: a shared direction plus small noise.
    g = [tf.constant(direction + 0.1 * rng.normal(size=20), tf.float32)]
    s_damped, w_damped = damped.next(s_damped, w_damped, g)
    s_plain, w_plain = plain.next(s_plain, w_plain, g)
  np.testing.assert_allclose(w_damped[0], w_plain[0], rtol=1e-6)
  assert float(s_damped['learning_rate_scale']) == 1.0


def test_hparams_are_the_inner_optimizers_and_the_scale_survives_them():
  optimizer = server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(1.0, momentum=0.9))
  _, state = _quadratic_run(optimizer, 3.0, 2)
  assert dict(optimizer.get_hparams(state)) == pytest.approx(
      {'learning_rate': 1.0, 'momentum': 0.9})
  state = optimizer.set_hparams(state, {'learning_rate': 0.2})
  assert float(optimizer.get_hparams(state)['learning_rate']) == 0.2
  assert float(state['learning_rate_scale']) == 0.5
  with pytest.raises(KeyError, match='beta'):
    optimizer.set_hparams(state, {'beta': 0.1})
  # A scheduled learning rate drives it (TFF's schedule sets the hparam).
  scheduled = tff.learning.optimizers.schedule_learning_rate(
      server_step.oscillation_damped(tff.learning.optimizers.build_sgdm(1.0)),
      lambda round_num: 0.1)
  state = scheduled.initialize(_spec())
  state, weights = scheduled.next(state, [tf.ones([_D])], [tf.ones([_D])])
  np.testing.assert_allclose(weights[0], 0.9 * np.ones(_D), rtol=1e-6)


def test_a_non_finite_update_is_no_evidence():
  optimizer = server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(1.0))
  state = optimizer.initialize(_spec())
  for g in (np.ones(_D), np.full(_D, np.nan), np.ones(_D)):
    state, _ = optimizer.next(state, [tf.zeros([_D])],
                              [tf.constant(g, tf.float32)])
    assert math.isfinite(float(state['cosine_average']))
  assert float(state['learning_rate_scale']) == 1.0


@pytest.mark.parametrize('kwargs, error, name', [
    (dict(threshold=0.0), ValueError, 'threshold'),
    (dict(threshold=float('nan')), ValueError, 'threshold'),
    (dict(decay=1.0), ValueError, 'decay'),
    (dict(decay=-0.1), ValueError, 'decay'),
    (dict(factor=1.0), ValueError, 'factor'),
    (dict(factor=0.0), ValueError, 'factor'),
    (dict(factor='half'), TypeError, 'factor'),
])
def test_bad_arguments_raise_naming_the_argument(kwargs, error, name):
  with pytest.raises(error, match=f'`{name}`'):
    server_step.oscillation_damped(tff.learning.optimizers.build_sgdm(1.0),
                                  **kwargs)
  with pytest.raises(TypeError, match='`inner_optimizer`'):
    server_step.oscillation_damped(tf.keras.optimizers.SGD())


# ----------------------------------------------------------------------------
# growth_held: the step's norm held at the smallest update norm since warm-up.
# Oracle: plain SGD's step is -lr g_t, so the held step is -lr g_t scaled to
# norm min(||g_t||, min_{W <= s <= t} ||g_s||), in closed form; where the
# norms never grow it is TFF's own build_sgdm, step for step.


def _steps(optimizer, updates):
  """The weight changes an optimizer makes from w = 0 for these updates."""
  d = len(updates[0])
  state = optimizer.initialize(_spec(d))
  weights, steps = [tf.zeros([d])], []
  for g in updates:
    state, new = optimizer.next(state, weights,
                                [tf.constant(g, tf.float32)])
    steps.append(np.asarray(new[0]) - np.asarray(weights[0]))
    weights = new
  return steps, state


def test_growing_updates_step_no_longer_than_the_smallest_since_warmup():
  rng = np.random.default_rng(0)
  norms = [3.0, 1.0, 2.0, 0.5, 4.0, 8.0, 0.25, 16.0]
  updates = [n * u / np.linalg.norm(u)
             for n, u in zip(norms, rng.normal(size=(len(norms), 30)))]
  steps, state = _steps(server_step.growth_held(
      tff.learning.optimizers.build_sgdm(0.5), warmup_rounds=3), updates)
  # Rounds 1-2 pass; from round 3 the floor is the running minimum of the
  # norms of rounds 3.. (2, 0.5, 0.5, 0.5, 0.25, 0.25).
  floors = [math.inf, math.inf, 2.0, 0.5, 0.5, 0.5, 0.25, 0.25]
  for step, g, n, floor in zip(steps, updates, norms, floors):
    expected = -0.5 * g * min(1.0, floor / n)
    np.testing.assert_allclose(step, expected, rtol=1e-5, atol=1e-7)
  assert float(state['update_norm_floor']) == pytest.approx(0.25)
  assert float(state['hold_scale']) == pytest.approx(0.25 / 16.0)
  assert server_step.step_scale(state) == pytest.approx(0.25 / 16.0)


@pytest.mark.parametrize('scale', [1e-12, 1e10])
def test_the_damped_step_halves_at_any_float32_scale_of_the_updates(scale):
  # The cosine is scale-free: alternating updates have cosine -1 whatever
  # their norm (here 3e-11 or 3e11), so the second round halves as at
  # scale 1. The float32 product |g|^2 |p|^2 flushed to 0 below norms of
  # about 3e-10 and overflowed above 4e9, and the step never halved.
  optimizer = server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(1.0))
  state = optimizer.initialize(_spec())
  weights = [tf.fill([_D], scale)]
  for _ in range(2):
    state, weights = optimizer.next(state, weights, [3.0 * weights[0]])
  assert float(state['learning_rate_scale']) == 0.5


@pytest.mark.parametrize('scale', [1e-21, 1e19])
def test_the_held_step_holds_at_any_float32_scale_of_the_updates(scale):
  # Norms 1, 4, 2 times `scale` from round 1 on: the last step is held to
  # the smallest, floor / norm = 1/2 (the float32 square of the norm
  # flushed to 0 below 1e-19 and overflowed above 1.8e19: no hold).
  updates = [scale * n * np.eye(_D)[0] for n in (1.0, 4.0, 2.0)]
  _, state = _steps(server_step.growth_held(
      tff.learning.optimizers.build_sgdm(0.5), warmup_rounds=1), updates)
  assert float(state['update_norm_floor']) == pytest.approx(scale)
  assert float(state['hold_scale']) == pytest.approx(0.5)


def test_shrinking_updates_are_tffs_sgdm_step_for_step():
  rng = np.random.default_rng(1)
  updates = [0.8**t * u / np.linalg.norm(u)
             for t, u in enumerate(rng.normal(size=(15, 20)))]
  held, _ = _steps(server_step.growth_held(
      tff.learning.optimizers.build_sgdm(0.5, momentum=0.9),
      warmup_rounds=1), updates)
  plain, _ = _steps(tff.learning.optimizers.build_sgdm(0.5, momentum=0.9),
                    updates)
  np.testing.assert_allclose(np.cumsum(held, 0), np.cumsum(plain, 0),
                             rtol=1e-5, atol=1e-6)


def test_a_zero_or_non_finite_update_leaves_the_floor():
  optimizer = server_step.growth_held(tff.learning.optimizers.build_sgdm(1.0),
                                      warmup_rounds=1)
  state = optimizer.initialize(_spec())
  for g in (np.full(_D, 0.1), np.zeros(_D), np.full(_D, np.nan),
            np.full(_D, np.inf)):
    state, _ = optimizer.next(state, [tf.zeros([_D])],
                              [tf.constant(g, tf.float32)])
    assert float(state['update_norm_floor']) == pytest.approx(1.0)
    assert float(state['hold_scale']) == 1.0


def test_held_over_damped_releases_the_product_of_their_scales():
  optimizer = server_step.growth_held(server_step.oscillation_damped(
      tff.learning.optimizers.build_sgdm(1.0)), warmup_rounds=1)
  # On L ||w||^2 / 2 from w0 with eta L = 3: g1 = 3 w0, w1 = -2 w0; g2 =
  # -6 w0 has twice g1's norm, so the hold halves it, and points opposite
  # g1 (average cosine -0.2, below the limit -3 sqrt(0.2 / 1.8 / 100) =
  # -0.1), so the damping halves it too: w2 = -2 w0 + 6 w0 / 4 = -w0 / 2.
  norms, state = _quadratic_run(optimizer, 3.0, 2)
  assert norms == pytest.approx([2 * math.sqrt(_D), 0.5 * math.sqrt(_D)])
  assert float(state['hold_scale']) == 0.5
  assert float(state['inner']['learning_rate_scale']) == 0.5
  assert server_step.step_scale(state) == 0.25
  # Forty rounds on: the damping has halved (its scale is released too).
  _, state = _quadratic_run(optimizer, 3.0, 40)
  assert server_step.step_scale(state) == pytest.approx(
      float(state['inner']['learning_rate_scale']) *
      float(state['hold_scale']))
  assert dict(optimizer.get_hparams(state)) == {'learning_rate': 1.0}
  assert server_step.step_scale({'learning_rate': 1.0}) is None


@pytest.mark.parametrize('warmup, error', [
    (0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_growth_held_refuses_a_bad_warmup_naming_it(warmup, error):
  with pytest.raises(error, match='`warmup_rounds`'):
    server_step.growth_held(tff.learning.optimizers.build_sgdm(1.0),
                            warmup_rounds=warmup)
  with pytest.raises(TypeError, match='`inner_optimizer`'):
    server_step.growth_held(tf.keras.optimizers.SGD())


# ----------------------------------------------------------------------------
# --server_step: what the default resolves to, and what a run records.


@pytest.mark.parametrize('fields, noise, resolved', [
    ({}, 1.0, 'damped'),  # A DP run of tff_clip's default bounding.
    (dict(bounding='clip'), 0.5, 'damped'),
    ({}, None, 'fixed'),  # No DP.
    (dict(bounding='tff_gaussian', clip_norm='adaptive'), 1.0, 'fixed'),
    (dict(server_step='fixed'), 1.0, 'fixed'),
    (dict(server_step='damped'), None, 'damped'),
    (dict(server_step='held'), 1.0, 'held'),
    # Correlated noise: consecutive rounds' noise points apart by design.
    (dict(noise_mechanism='blt', sampling='min_separation', min_separation=5),
     1.0, 'fixed'),
    (dict(noise_mechanism='banded', bands=4, sampling='min_separation',
          min_separation=4), 1.0, 'fixed'),
    (dict(noise_mechanism='tree', sampling='min_separation', min_separation=4),
     1.0, 'fixed'),
])
def test_the_default_damps_dp_runs_of_tff_clips_boundings_only(
    fields, noise, resolved):
  from tff_clip.program import assembly
  from tff_clip.program.config import TrainConfig
  assert assembly.resolved_server_step(TrainConfig(**fields), noise) == (
      resolved)
  optimizer = assembly.server_parts(TrainConfig(**fields), noise)[1]
  layers = []
  while isinstance(optimizer, tff.learning.optimizers.Optimizer):
    layers.append(type(optimizer).__name__)
    optimizer = getattr(optimizer, 'inner_optimizer', None)
  assert layers[:-1] == {'fixed': [], 'damped': ['_OscillationDamped'],
                         'held': ['_GrowthHeld', '_OscillationDamped']
                         }[resolved]


@pytest.mark.parametrize('step', ['damped', 'held'])
def test_a_damped_step_under_correlated_noise_is_refused_naming_both_flags(
    step):
  # BLT's, banded and tree noise cancel across rounds: consecutive rounds'
  # noise has a negative cosine far beyond independent noise's N(0, 1/d),
  # so the damping would halve the step every round (a BLT run on digits
  # ended at 2e-12 of its learning rate and chance accuracy).
  from tff_clip.program import config as config_lib
  config = config_lib.TrainConfig(
      noise_mechanism='blt', sampling='min_separation', min_separation=5,
      noise_multiplier=1.0, server_step=step)
  with pytest.raises(config_lib.ConfigError,
                     match=f"--server_step={step}.*--noise_mechanism=blt"):
    config_lib.validate(config)


@pytest.mark.parametrize('name, bands', [('blt', 1), ('banded', 5),
                                         ('tree', 5)])
def test_correlated_noise_alone_makes_the_damped_step_halve(name, bands):
  # Why `auto` keeps a correlated run's step fixed: the damped step fed
  # noise alone (no signal) keeps its learning rate under independent noise
  # and halves it under the mechanism's noise (sampled from its own
  # covariance across rounds, an oracle independent of its TF stream).
  from tff_clip.aggregation import mechanisms
  d, rounds = 2_000, 30
  mechanism = mechanisms.noise_mechanism(name, bands, rounds=rounds,
                                         separation=5)
  independent = np.random.default_rng(0).standard_normal((rounds, d))
  correlated = np.linalg.cholesky(
      mechanism.noise_covariance(rounds)) @ independent
  for noise, halves in ((independent, False), (correlated, True)):
    optimizer = server_step.oscillation_damped(
        tff.learning.optimizers.build_sgdm(1.0))
    weights = (tf.zeros([d]),)
    state = optimizer.initialize((tf.TensorSpec([d], tf.float32),))
    for t in range(rounds):
      state, weights = optimizer.next(
          state, weights, (tf.constant(noise[t], tf.float32),))
    assert (server_step.step_scale(state) < 0.5) == halves, name


def test_an_unknown_server_step_is_refused_naming_the_flag():
  from tff_clip.program import config as config_lib
  with pytest.raises(config_lib.ConfigError, match='server_step'):
    config_lib.validate(config_lib.TrainConfig(server_step='adaptive'))


def test_a_run_recorded_before_the_knob_is_one_with_a_fixed_step(tmp_path):
  # Its config.json has no server_step: it kept its learning rate, so it is
  # resumed (or skipped) only as a fixed-step run, never as the new default.
  from tff_clip.program import run_directory
  from tff_clip.program.config import ConfigError, TrainConfig
  config = TrainConfig(root_output_dir=str(tmp_path), experiment_name='old',
                       noise_multiplier=1.0)
  record = config.identity()
  del record['server_step']
  (tmp_path / 'old').mkdir()
  (tmp_path / 'old' / 'config.json').write_text(json.dumps(record))
  with pytest.raises(ConfigError, match='differs in: server_step'):
    run_directory.existing_run(config)
  import dataclasses
  fixed = dataclasses.replace(config, server_step='fixed')
  assert run_directory.existing_run(fixed) == 'resume'


@pytest.mark.parametrize('build', [server_step.oscillation_damped,
                                   server_step.growth_held])
def test_an_optimizer_without_a_learning_rate_to_scale_is_refused(build):
  """TFF's scheduled optimizer keeps its rate in its own state (its
  hyperparameters hold none): refused when the step is built, not in the
  first round inside the server's computation."""
  scheduled = tff.learning.optimizers.schedule_learning_rate(
      tff.learning.optimizers.build_sgdm(1.0),
      lambda k: 0.5**tf.cast(k, tf.float32))
  assert 'learning_rate' not in scheduled.get_hparams(
      scheduled.initialize([tf.TensorSpec([3], tf.float32)]))
  with pytest.raises(ValueError, match='^`inner_optimizer` has no '
                     '`learning_rate` hyperparameter'):
    build(scheduled)
