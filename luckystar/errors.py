"""Bad input from the user: a config value, a data file, a checkpoint path."""


class UserError(Exception):
  """main prints it without a traceback. The message must name the key, file:line or path, and say what
  to do."""


class InvalidFile(UserError, ValueError):
  """A file or directory that exists but is not what it should be (malformed JSON, a truncated weight file, a
  tensor of the wrong shape). Also a ValueError, which is what callers caught before it was a UserError."""


class MissingFile(UserError, FileNotFoundError):
  """A path the user named, or one a file they named points to, that does not exist. Also a
  FileNotFoundError, which is what callers caught before it was a UserError."""
