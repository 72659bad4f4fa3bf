"""The one progress-bar wrapper (tqdm, imported only when a bar is made)."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, desc: str, enabled: bool = True, *, unit: str = "it",
                 leave: bool = True, terminal_only: bool = False) -> Any:
    """A tqdm bar on stderr, silent when not ``enabled`` (or, with ``terminal_only``, when
    stderr is not a terminal, so logs and tests stay clean). Usable as a context manager."""
    from tqdm.auto import tqdm

    shown = enabled and (not terminal_only or sys.stderr.isatty())
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, disable=not shown)
