"""Finding the first NaN or Inf among a step's losses and gradient norms."""

from typing import TYPE_CHECKING, Mapping

import numpy as np

if TYPE_CHECKING:  # Annotations only: validation does not import jax.
  from trax_revplus.typing import Array
  from trax_revplus.typing import HostArray


def first_non_finite(
  values: 'Mapping[str, Array | HostArray | float]',
) -> str | None:
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
