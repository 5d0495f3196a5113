"""Where epi keeps its caches and prepared assets on this machine.

Standard library only: the CLI (its crash logs), the model and eval-data preparers and the
result caches all root their files here, so the rule is written once.
"""

from __future__ import annotations

import os
from pathlib import Path


def epi_home() -> Path:
    """Root of epi's caches, logs and prepared assets: $EPI_HOME, or ~/.cache/epi when unset
    or empty."""
    return Path(os.environ.get("EPI_HOME") or Path.home() / ".cache" / "epi")
