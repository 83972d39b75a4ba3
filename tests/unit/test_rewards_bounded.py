"""The bounded verifier runner (`trajflow.rewards.bounded`) with real worker processes: an overrunning call is killed
and its process is gone, the next call still works on a fresh worker, and raises, input errors and crashes come
back typed. Also the registry's rule that a bounded function is module-level."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.rewards import bounded, registry

LIMIT_S = 0.5


def _pid() -> int:
    return os.getpid()


def _spin() -> None:
    while True:  # a verifier that loops: only a kill ends it
        pass


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def _raise() -> None:
    raise ZeroDivisionError("boom")


def _input_error() -> None:
    raise registry.RewardInputError("no reference answer")


def _die() -> None:
    os._exit(3)


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process `pid` no longer exists (polled: the forkserver reaps its children on SIGCHLD)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def runner() -> Iterator[bounded.BoundedRunner]:
    r = bounded.BoundedRunner(LIMIT_S, processes=2, preload=[__name__])
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize(("fn", "args"), [(_spin, ()), (_sleep, (60.0,))])
def test_a_call_past_the_limit_is_killed_and_the_next_call_works(
    runner: bounded.BoundedRunner, fn: Callable[..., object], args: tuple[object, ...]
) -> None:
    first = runner.call("pid", _pid)
    assert runner.call("pid", _pid) == first  # the worker is reused
    with pytest.raises(bounded.VerifierTimedOut) as info:
        runner.call("slow", fn, *args)
    assert info.value.timeout_s == LIMIT_S and f"timed out after {LIMIT_S:g} s" in str(info.value)
    assert _gone(first), f"worker {first} still exists after its call was killed"
    assert runner.pids() == []
    after = runner.call("pid", _pid)
    assert after != first and runner.call("sleeper", _sleep, 0.0) == "slept"


def test_the_error_names_the_verifier(runner: bounded.BoundedRunner) -> None:
    with pytest.raises(bounded.VerifierTimedOut, match="verifier 'my_check' timed out") as info:
        runner.call("my_check", _spin)
    assert info.value.name == "my_check"


def test_a_raise_comes_back_typed_with_its_traceback(runner: bounded.BoundedRunner) -> None:
    with pytest.raises(bounded.VerifierRaised, match="ZeroDivisionError: boom") as info:
        runner.call("raises", _raise)
    assert info.value.type_name == "ZeroDivisionError" and "_raise" in info.value.traceback
    with pytest.raises(registry.RewardInputError, match="no reference answer"):
        runner.call("input", _input_error)
    assert runner.call("sleeper", _sleep, 0.0) == "slept"  # the worker survived both


def test_a_worker_that_dies_is_a_crash_and_is_replaced(runner: bounded.BoundedRunner) -> None:
    with pytest.raises(bounded.VerifierCrashed, match="exit code 3"):
        runner.call("dies", _die)
    assert runner.call("sleeper", _sleep, 0.0) == "slept"


def test_an_overrun_does_not_hold_up_the_other_worker(runner: bounded.BoundedRunner) -> None:
    errors: list[BaseException] = []

    def overrun() -> None:
        try:
            runner.call("spinner", _spin)
        except bounded.VerifierTimedOut as e:
            errors.append(e)

    thread = threading.Thread(target=overrun)
    thread.start()
    results = [runner.call("sleeper", _sleep, 0.01) for _ in range(5)]  # served by the second worker meanwhile
    thread.join(timeout=30)
    assert results == ["slept"] * 5 and len(errors) == 1


def test_close_kills_every_worker() -> None:
    r = bounded.BoundedRunner(LIMIT_S, processes=1, preload=[__name__])
    pid = r.call("pid", _pid)
    r.close()
    assert _gone(pid)
    with pytest.raises(RuntimeError, match="closed"):
        r.call("pid", _pid)


@pytest.mark.parametrize(("timeout_s", "processes"), [(0.0, 1), (float("inf"), 1), (1.0, 0)])
def test_bad_limits_are_refused(timeout_s: float, processes: int) -> None:
    with pytest.raises(ValueError):
        bounded.BoundedRunner(timeout_s, processes)


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(bounded.TIMEOUT_ENV, raising=False)
    assert bounded.timeout_from_env() == bounded.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(bounded.TIMEOUT_ENV, "2.5")
    assert bounded.timeout_from_env() == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv(bounded.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=bounded.TIMEOUT_ENV):
            bounded.timeout_from_env()
    monkeypatch.setenv(bounded.PROCESSES_ENV, "0")
    with pytest.raises(ValueError, match=bounded.PROCESSES_ENV):
        bounded.processes_from_env()


def test_a_bounded_reward_fn_must_be_module_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    def local(req: ScoreRequest) -> ScoreResult:
        return ScoreResult(reward=0.0, reward_fn="local")

    with pytest.raises(ValueError, match="module-level function"):
        registry.register("local")(local)
    with pytest.raises(ValueError, match="module-level function"):
        registry.register("lam")(lambda req: ScoreResult(reward=0.0, reward_fn="lam"))
    registry.register("local", bounded=False)(local)
    assert registry.registered("local") == (local, False)
    assert registry.registered("math_verify").bounded and not registry.registered("env_outcome").bounded
