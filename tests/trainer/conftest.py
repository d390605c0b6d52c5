"""Every trainer test starts from an empty gin config.

Its references (`trainer_cases`) and ours build trax's optimizers, whose
hyperparameters gin can bind: a binding an earlier test in the same worker
left behind (the main job's config binds `Adam.b2` and `Adam.eps`) would
reach one and not the other, and which tests share a worker depends on
timing.
"""

import gin
import pytest


@pytest.fixture(autouse=True)
def _empty_gin():
  gin.clear_config()
  yield
  gin.clear_config()
