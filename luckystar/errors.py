"""Bad input from the user: a config value, a data file, a checkpoint path."""


class UserError(Exception):
  """main prints it without a traceback. The message must name the key, file:line or path, and say what
  to do."""
