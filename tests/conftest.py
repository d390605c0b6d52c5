"""Fixtures the test modules share."""

import gin
import pytest

import trax_revplus


@pytest.fixture
def stock_trax_and_empty_gin():
  """Each test starts and ends with stock trax bound and no gin config."""
  trax_revplus.deactivate()
  gin.clear_config()
  yield
  trax_revplus.deactivate()
  gin.clear_config()
