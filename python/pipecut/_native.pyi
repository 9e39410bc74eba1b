"""Type stubs of the extension module (crates/python/src/lib.rs)."""

from typing import List

class Error(Exception):
    """Any failure of a pipecut call; its message is the command's one-line error."""

class NoAnswer(Error):
    """The model does not fit the devices, or a plan is invalid for its model (exit code 1)."""

class Undecided(Error):
    """No fitting plan found before the time limit or work budget ran out, and "does not fit"
    not proven either (exit code 3)."""

class BadInput(Error):
    """Unreadable or malformed files, bad arguments, unsupported models (exit code 2)."""

class InternalError(Error):
    """A panic inside pipecut (a bug), reported instead of aborting the interpreter."""

def command(args: List[str]) -> str:
    """Runs ``pipecut ARGS...`` in this process, without the GIL; returns what it printed."""

def version() -> str:
    """The version of the pipecut crates inside this module."""
