"""Errors of the local text inputs: a corpus or a setting that cannot work."""


class CorpusError(ValueError):
  """A corpus or batching setting that cannot work; the message says why.

  Raised as is when the files named do not make a corpus (no match, empty,
  too short); as `CorpusSettingError` when a setting is out of range.
  """


class CorpusSettingError(CorpusError):
  """A `local_text_inputs` setting out of range, whatever the files hold.

  E.g. a batch size that is not a positive int or does not divide over the
  devices, or an unknown `split_by`.
  """
