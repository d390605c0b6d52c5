"""Finding the first NaN or Inf among a step's losses and gradient norms."""

import numpy as np


def first_non_finite(values):
  """Returns the name of the first non-finite value in `values`, or None.

  Args:
    values: dict name -> scalar or array (host or device); reading a device
      array waits for it.

  Returns:
    str or None.
  """
  for name, value in values.items():
    if not np.all(np.isfinite(np.asarray(value))):
      return name
  return None
