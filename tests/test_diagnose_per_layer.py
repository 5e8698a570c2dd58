"""Specification of the per-layer diagnosis (`scripts.diagnose_per_layer`)."""

import as_a_user  # pylint: disable=g-bad-import-order

MODULE = 'scripts.diagnose_per_layer'


def test_each_layer_gets_its_budget_and_the_noise_of_its_scalars():
  # Closed forms, two layers of 4 and 100 scalars with mean norms 3 and 4
  # (total 5), noise std 0.1 per scalar: the noise norms are 0.2 and 1.0.
  # Global C = 2.5 scales every layer by C / m = 0.5: budgets 1.5 and 2.0.
  # Per-layer budgets (1, 10) carry min(C_h, m_h) = 1 and 4.
  code = f'''
import {MODULE} as d
for budgets in (2.5, [1.0, 10.0]):
  for r in d.layer_rows('b', 1, [4, 100], [3.0, 4.0], budgets, 0.1):
    print(r['size'], round(r['budget'], 6), round(r['signal'], 6),
          round(r['noise'], 6), round(r['noise_to_signal'], 6))
'''
  result = as_a_user.python(code, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split('\n')[:4] == [
      '4 1.5 1.5 0.2 0.133333', '100 2.0 2.0 1.0 0.5',
      '4 1.0 1.0 0.2 0.2', '100 10.0 4.0 1.0 0.25']
