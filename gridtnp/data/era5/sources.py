"""The sources of a multi-source task and its ``task:`` section: ``Source`` (``"u@850"``: variable ``u`` at level
850) and ``MultiSourceTaskConfig`` (the sources, targets and window of ``MultiSourceDataModule``)."""

from __future__ import annotations

from dataclasses import dataclass

from gridtnp.data.sections import LoaderConfig, check_count, fraction_range
from gridtnp.registry import ConfigError


class Source:
    """One modality of a multi-source task: ``"u10"`` (a variable) or ``"u@850"`` (variable ``u`` at level 850).

    ``name`` is the context-source key (``"u850"`` for ``"u@850"``).
    """

    def __init__(self, spec: str) -> None:
        variable, _, level = str(spec).partition("@")
        if not variable or (level and not _is_number(level)):
            raise ConfigError(f"Variable {spec!r}: expected a name such as 'u10', or name@level such as 'u@850'.")
        self.spec, self.variable = str(spec), variable
        self.level = float(level) if level else None
        self.name = variable if self.level is None else f"{variable}{self.level:g}"

    def __repr__(self) -> str:
        return f"Source({self.spec!r})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class MultiSourceTaskConfig:
    """What a multi-source task holds (``task:``).

    Args:
        variables: the context sources, ``"name"`` or ``"name@level"`` (e.g. ``["u@700", "v@700", "u10"]``).
        target_variables: the variables predicted at the targets, in ``variables``' notation (default: all).
        window: consecutive hours per task (T).
        context_fraction: ``(a, b)``: each source's context share per task ``~ U[a, b]`` (the paper's
            U[0.05, 0.25]).
        target_fraction: share of the points used as targets (the paper's 0.25).
    """

    variables: tuple[str, ...] = ("t2m",)
    target_variables: tuple[str, ...] | None = None
    window: int = 4
    context_fraction: tuple[float, float] = (0.05, 0.25)
    target_fraction: float = 0.25

    def __post_init__(self) -> None:
        check_count("task.window", self.window, 1)
        if isinstance(self.variables, str) or not self.variables:
            raise ConfigError(
                f"task.variables must be a non-empty list such as ['u@700', 'v@700']; got {self.variables!r}."
            )
        names = [Source(v).name for v in self.variables]
        if len(set(names)) != len(names):
            raise ConfigError(f"task.variables {list(self.variables)} name a source twice.")
        targets = self.target_variables
        if isinstance(targets, str) or (targets is not None and not targets):
            raise ConfigError(f"task.target_variables must be a non-empty list (or null: all); got {targets!r}.")
        unknown = [t for t in (targets or ()) if Source(t).name not in names]
        if unknown:
            raise ConfigError(f"task.target_variables {list(targets)} must be a subset of task.variables {names}.")
        object.__setattr__(self, "variables", tuple(self.variables))
        object.__setattr__(self, "target_variables", None if targets is None else tuple(targets))
        object.__setattr__(self, "context_fraction", fraction_range("task.context_fraction", self.context_fraction))
        if not 0.0 < float(self.target_fraction) < 1.0:
            raise ConfigError(f"task.target_fraction must be in (0, 1); got {self.target_fraction!r}.")


DEFAULT_MULTISOURCE_TASK = MultiSourceTaskConfig()
#: 8 tasks a batch, 100 training batches an epoch, fixed sets of 16 (val) and 32 (test) batches.
MULTISOURCE_LOADER = LoaderConfig(batch_size=8, train_batches=100, val_batches=16, test_batches=32)
