"""The one exception type for mistakes a user can fix.

The CLI prints a `UserError` as a single line and exits non-zero; anything else
is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """Bad input: wrong shapes, non-finite values, foreign or corrupt files, bad specs."""


class ModelFault(UserError):
    """A user's model failed while it ran: it raised, called sys.exit, or gave NaN / Inf (`models.user`).
    Every batch needs the model, so nothing that catches one analyzer's failure may catch this one."""


def check(condition: bool, message: str) -> None:
    """Raise `UserError(message)` unless `condition` holds."""
    if not condition:
        raise UserError(message)


def one_line(exc: BaseException) -> str:
    """A failure as one line: a UserError's own message, otherwise 'ExceptionType: first line'."""
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return msg if isinstance(exc, UserError) else f"{type(exc).__name__}: {msg}".rstrip(": ")
