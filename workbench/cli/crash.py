"""No traceback reaches a user's terminal: a bug's traceback goes to a file, the terminal gets
one line naming it. Used for an unexpected exception that ends a command (`cli.main`), and for
the ones a long-running command survives and logs (`workbench serve`'s backend failures:
`one_line_logging`)."""

from __future__ import annotations

import logging
import sys
import tempfile
import traceback
from types import TracebackType

from workbench.errors import redact_credentials

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def crash_report(exc_info: ExcInfo, headline: str) -> str:
    """Write `headline` and the exception's traceback to a new file in the temp folder; its path."""
    with tempfile.NamedTemporaryFile("w", prefix="workbench-crash-", suffix=".log", delete=False) as report:
        text = f"{headline}\n\n{''.join(traceback.format_exception(*exc_info))}"
        report.write(redact_credentials(text))
    return report.name


def summary(exc: BaseException) -> str:
    """`Type: first line of the message` (at most 300 characters of it)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


class OneLineHandler(logging.Handler):
    """Each record on stderr as one line (`error: ...` from ERROR up); a record carrying an
    exception adds its type and message and the file its traceback was written to."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                report = crash_report(record.exc_info, f"workbench {' '.join(sys.argv[1:])}: {line}")
                line = f"{line}: {summary(record.exc_info[1])} (traceback in {report})"
            line = redact_credentials(line)
            print(f"error: {line}" if record.levelno >= logging.ERROR else line, file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


def one_line_logging() -> None:
    """Workbench's own log records (a server that lives on after a backend bug) as one line each."""
    logger = logging.getLogger("workbench")
    if not any(isinstance(handler, OneLineHandler) for handler in logger.handlers):
        logger.addHandler(OneLineHandler())
        logger.propagate = False
