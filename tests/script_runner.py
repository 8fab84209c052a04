"""Runs a workflow script (workflow/scripts/*.py) in-process on constructed inputs, with the
``snakemake`` object Snakemake would give it (named inputs, outputs, params, wildcards,
threads, log), so that tests see what the script itself does, not only the library functions
it calls."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[1] / "workflow" / "scripts"


class Named(list):
    """Snakemake's named lists: positional items, attribute access by name, keys() and get()."""

    def __init__(self, **named: Any) -> None:
        super().__init__(named.values())
        self._names = dict(named)
        for key, value in named.items():
            setattr(self, key, value)

    def keys(self):
        return self._names.keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self._names.get(key, default)


class Snakemake:
    """The ``snakemake`` object of a script run."""

    def __init__(
        self,
        *,
        input: dict,
        output: dict,
        params: dict,
        log: Path,
        wildcards: dict | None = None,
        threads: int = 1,
    ) -> None:
        self.input = Named(**{k: str(v) if isinstance(v, Path) else v for k, v in input.items()})
        self.output = Named(**{k: str(v) for k, v in output.items()})
        self.params = Named(**params)
        self.wildcards = Named(**(wildcards or {}))
        self.log = [str(log)]
        self.threads = threads


def run_script(name: str, snakemake: Snakemake) -> dict[str, Any]:
    """Run ``workflow/scripts/<name>.py`` with ``snakemake``; returns its module globals."""
    return runpy.run_path(str(SCRIPTS / f"{name}.py"), init_globals={"snakemake": snakemake})
