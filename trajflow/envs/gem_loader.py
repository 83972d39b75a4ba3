"""Imports `gem` once, in a background thread, for the env runner (`trajflow/envs/runner.py`): the runner's socket is
up at once and the import overlaps the host's readiness wait.

GEM's registry imports reasoning_gym (and with it sympy) only to list the `rg:` ids; a loader made for another env
(`env_hint`) puts a stand-in that lists no `rg:` ids in its place. Stdlib only, like the runner.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType


class GemUnavailable(Exception):
    """`gem` could not be imported; the message says why."""


def _stand_in_for_reasoning_gym() -> None:
    """GEM's env registry needs only `reasoning_gym.factory.DATASETS.keys()` at import; list none."""
    stub, factory = ModuleType("reasoning_gym"), ModuleType("reasoning_gym.factory")
    factory.DATASETS = {}  # type: ignore[attr-defined]
    stub.factory = factory  # type: ignore[attr-defined]
    sys.modules.setdefault("reasoning_gym", stub)
    sys.modules.setdefault("reasoning_gym.factory", factory)


class GemLoader:
    """Imports `gem` once, in the background, and hands it out (or the import's error) when asked."""

    def __init__(self, env_hint: str = "") -> None:
        self.light = bool(env_hint) and not env_hint.startswith("rg:")
        """Skip reasoning_gym: the sandbox was started for a non-`rg:` env."""
        self._done = threading.Event()
        self._module: ModuleType | None = None
        self._error: str | None = None
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._load, name="gem-import", daemon=True).start()

    def _load(self) -> None:
        try:
            if self.light:
                _stand_in_for_reasoning_gym()
            import gem  # deliberately late: importing gem takes ~1-2 s (0.2 s light)

            self._module = gem
        except Exception as e:
            self._error = f"{type(e).__name__}: {e}"
        finally:
            self._done.set()

    @property
    def loaded(self) -> bool:
        return self._done.is_set() and self._module is not None

    def get(self) -> ModuleType:
        self.start()
        self._done.wait()
        if self._module is None:
            raise GemUnavailable(f"cannot import gem: {self._error}")
        return self._module
