"""The --bounding values that are not tff_clip boundings: the baselines.

`none` (no bounding, no DP) and TFF's own DP aggregators, which
`scripts.train` runs for comparison: each is a `Baseline` that says what it
needs of a configuration (`check`, called by `tff_clip.program.config.validate`)
and how the program treats it; its aggregator is built by
`tff_clip.program.assembly.build_aggregator`. No TensorFlow import.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import spec

__all__ = ['BASELINES', 'Baseline', 'NO_BOUNDING', 'TFF_GAUSSIAN', 'TFF_TREE',
           'baseline']

# 'tff_gaussian': TFF's own DP aggregator (`DifferentiallyPrivateFactory.
# gaussian_fixed` / `gaussian_adaptive`, what `tff.learning.dp_aggregator`
# builds on), the baseline tff_clip is measured against.
TFF_GAUSSIAN = 'tff_gaussian'
# TFF's DifferentiallyPrivateFactory.tree_adaptive (DP-FTRL), restarted
# every --bands rounds: the baseline of docs/correlated_noise.md.
TFF_TREE = 'tff_tree_adaptive'
NO_BOUNDING = 'none'


@dataclasses.dataclass(frozen=True)
class Baseline:
  """A --bounding that is not a tff_clip bounding: what it needs.

  `private`: the run must be DP (True) or must not be (False);
  `noise_mechanism`: the noise it adds (when private); `adaptive`: it needs
  --clip_norm=adaptive; `seeded`: it draws its noise from tff_clip's key
  (so --noise_seed applies and the noise is checked secret);
  `reports_events`: its aggregator state reports the DpEvent it ran (else
  the ledger records its noise mechanism's participation event). Its
  aggregator is built by `tff_clip.program.assembly.build_aggregator`.
  """
  description: str
  private: bool
  noise_mechanism: Optional[str] = None
  adaptive: bool = False
  seeded: bool = True
  reports_events: bool = True

  def check(self, config, name: str) -> None:
    """Raises ValueError (in flag form) unless `config` (a
    `tff_clip.program.config.TrainConfig` whose --bounding is `name`) suits it."""
    said = f'--bounding={name} is {self.description}'
    if not self.private:
      if config.private:
        raise ValueError(f'{said}: give --noise_multiplier=none, or a '
                         'tff_clip --bounding '
                         f'({", ".join(mechanisms.BOUNDINGS)}) for DP.')
      return
    if not config.private:
      raise ValueError(f'{said}: it needs --noise_multiplier or '
                       '--target_epsilon.')
    if config.noise_mechanism != self.noise_mechanism:
      raise ValueError(f'{said}: its noise is --noise_mechanism='
                       f'{self.noise_mechanism}.')
    if config.noise_placement != spec.parameter('noise_placement').default:
      raise ValueError(f'{said}: it adds its noise on the server '
                       '(--noise_placement=central).')
    if self.adaptive and not isinstance(config.clip_norm, str):
      raise ValueError(f'{said}: it needs --clip_norm=adaptive.')
    if not self.seeded and config.noise_seed is not None:
      raise ValueError(f'{said}: it draws its noise with its own generator, '
                       'which --noise_seed does not seed.')


# The --bounding values outside `mechanisms.BOUNDINGS`.
BASELINES = {
    NO_BOUNDING: Baseline('no bounding (noise would have no sensitivity)',
                          private=False),
    TFF_GAUSSIAN: Baseline(
        "TFF's own DP aggregator (gaussian_fixed / gaussian_adaptive)",
        private=True, noise_mechanism='independent', seeded=False),
    # TFF's tree queries report UnsupportedDpEvent.
    TFF_TREE: Baseline("TFF's tree_adaptive", private=True,
                       noise_mechanism='tree', adaptive=True,
                       reports_events=False),
}


def baseline(config) -> Optional[Baseline]:
  """The `Baseline` a configuration's --bounding names, or None for a
  tff_clip bounding."""
  return BASELINES.get(config.bounding)
