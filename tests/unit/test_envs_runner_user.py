"""The runner hosting a user's own env class (`py:MODULE:CLASS`) over its real Unix socket, the module found on
PYTHONPATH as in a user env's image layer: the shipped example, and envs that break the interface."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_envs_runner import Client, _wait_for_socket, runner

ROOT = Path(__file__).resolve().parents[2]
FACTOR = "py:factor_env:FactorEnv"
BROKEN = """
import missing_requirement_xyz
"""
ODD = '''
from gym_adapter import GymTextEnv  # beside the runner, as in the image
from gym_text import InvalidAction

class Digits:
    """A user's own text interface for a gymnasium env: actions as bare digits."""
    instructions = "Move with a digit: 0 left, 1 down, 2 right, 3 up."
    def __init__(self, env):
        pass
    def observation(self, obs, info):
        return f"cell {obs}"
    def action(self, text):
        if text.strip() not in ("0", "1", "2", "3"):
            raise InvalidAction(f"{text.strip()!r} is not a digit from 0 to 3")
        return int(text.strip())

class DigitLake:
    def __init__(self):
        self.env = GymTextEnv("FrozenLake-v1", interface=Digits, is_slippery=False)
    def reset(self, seed=None):
        return self.env.reset(seed)
    def step(self, action):
        return self.env.step(action)
class FourTuple:
    def reset(self, seed=None):
        return "start", {}
    def step(self, action):
        return "obs", 0.0, True, {}

class NumberObservation:
    def reset(self, seed=None):
        return 42

class PlainReset:
    def __init__(self, size=3):
        self.size = size
    def reset(self, seed=None):
        return f"size {self.size} seed {seed}"
    def step(self, action):
        return action.upper(), 1.0, True, False, {"echo": action}
'''


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    extra = tmp_path_factory.mktemp("userenv")
    (extra / "odd_envs.py").write_text(ODD)
    (extra / "broken_env.py").write_text(BROKEN)
    path = extra / "env.sock"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples" / "factoring"), str(extra)])}
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)], env={**env, "TRAJFLOW_ENV_HINT": FACTOR})
    try:
        _wait_for_socket(path, proc)
        c = Client(path)
        yield c
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_example_env_plays_an_episode(client: Client) -> None:
    first = client(op="reset", env_id=FACTOR, seed=3, env_kwargs={"max_attempts": 2})
    assert first["ok"] and first["observation"].startswith("Factor the polynomial 3*x**2 + 22*x - 45")
    again = client(op="reset", env_id=FACTOR, seed=3, env_kwargs={"max_attempts": 2})
    assert again["observation"] == first["observation"]
    wrong = client(op="step", action="\\boxed{(x + 1)*(x + 2)}")
    assert (
        wrong["ok"]
        and wrong["reward"] == 0.0
        and not wrong["terminated"]
        and "1 attempt(s) left" in wrong["observation"]
    )
    right = client(op="step", action="so \\boxed{(3*x - 5)*(x + 9)}")
    assert right["ok"] and right["reward"] == 1.0 and right["terminated"] and right["info"]["solved"] is True


def test_a_plain_observation_and_kwargs_reach_the_class(client: Client) -> None:
    out = client(op="reset", env_id="py:odd_envs:PlainReset", seed=7, env_kwargs={"size": 5})
    assert out == {"ok": True, "observation": "size 5 seed 7", "info": {}}
    step = client(op="step", action="hi")
    assert step["observation"] == "HI" and step["info"] == {"echo": "hi"} and step["terminated"]


def test_a_user_env_brings_its_own_text_interface_to_a_gymnasium_env(client: Client) -> None:
    first = client(op="reset", env_id="py:odd_envs:DigitLake", seed=0)
    assert first["ok"] and first["observation"].startswith("Move with a digit") and "cell 0" in first["observation"]
    moved = client(op="step", action="2")
    assert moved["ok"] and "cell 1" in moved["observation"] and not moved["terminated"]
    bad = client(op="step", action="left")
    assert (
        bad["ok"] and bad["reward"] == -0.1 and bad["terminated"] and "is not a digit from 0 to 3" in bad["observation"]
    )


@pytest.mark.parametrize(
    ("request_fields", "kind", "says"),
    [
        ({"env_id": "py:no_such_module:X"}, "UnknownEnv", "no module 'no_such_module'"),
        ({"env_id": "py:odd_envs:Missing"}, "UnknownEnv", "has no class 'Missing'"),
        ({"env_id": "py:broken_env:X"}, "EnvError", "a requirement missing from its requirements.txt?"),
        ({"env_id": "py:odd_envs:NumberObservation"}, "EnvError", "returned a int observation"),
        ({"env_id": "py:odd_envs:PlainReset", "env_kwargs": {"colour": "red"}}, "BadRequest", "bad env_kwargs"),
    ],
)
def test_a_user_env_that_cannot_reset_says_why(client: Client, request_fields: dict, kind: str, says: str) -> None:
    out = client(op="reset", seed=0, **request_fields)
    assert not out["ok"] and out["error"]["type"] == kind and says in out["error"]["message"]


def test_a_step_that_breaks_the_interface_is_an_env_error(client: Client) -> None:
    assert client(op="reset", env_id="py:odd_envs:FourTuple", seed=0)["ok"]
    out = client(op="step", action="a")
    assert not out["ok"] and out["error"]["type"] == "EnvError"
    assert (
        "step returned a 4-tuple; an env's step returns (observation, reward, terminated, truncated, info)"
        in out["error"]["message"]
    )
