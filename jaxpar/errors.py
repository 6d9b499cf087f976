"""Errors users see as one line. This module imports nothing, so any module can raise them."""


class ConfigError(ValueError):
    """A configuration that cannot run; the message is one line with the fix."""


class TrainingError(RuntimeError):
    """A run that had to stop (diverged, unwritable workdir, workdir in use); one line."""
