"""``gridtnp predict`` stopped by SIGTERM or SIGHUP (a job's time limit, ``timeout``, a closed terminal) after the
batch being written, instead of running on: Lightning's own SIGTERM handler only logs it outside ``fit``.

* ``StopSignals``: records the signals during a prediction run (main thread only), restoring the handlers after.
* ``stop_line(reason, path)``: what was written, up to which time, and how to predict the rest.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

PREDICT_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """SIGTERM and SIGHUP recorded (``received``) from ``install`` to ``restore``, in place of their handlers."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        self.received = None
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for signum in PREDICT_STOP_SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received = signum


def stop_line(reason: str, path: Path) -> str:
    """The line a stopped ``gridtnp predict`` ends with: ``reason``, the file and its last time, how to go on."""
    last = last_time(path)
    upto = f" (to {last})" if last else ""
    return (
        f"gridtnp: predict {reason}: the predictions so far{upto} are in {path}, marked gridtnp_incomplete; to "
        "predict the rest, rerun with the split's dates starting after its last time and another --predictions.path, "
        "then join the files along time."
    )


def last_time(path: Path) -> str | None:
    """The last ``time`` of the predictions at ``path`` (ISO, to the second), or None without one."""
    try:
        with xr.open_zarr(path) if path.suffix == ".zarr" else xr.open_dataset(path) as ds:
            return str(np.datetime_as_string(ds["time"].values.max(), unit="s")) if "time" in ds.coords else None
    except Exception:  # a file without times, or unreadable here: the line names the file alone
        return None
