"""The shipped agent program (`examples/agent`, `agent:repo_agent:solve`, written on the `openai` client) as a
researcher brings one: `trajflow rollout` and a 2-step `trajflow train` of the example's config against the stack
`trajflow up` started (tiny model), its package built into the sandbox layer with `openai` from its requirements,
and a bad agent program refused at submission with what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, submitted_offline, wait_for
from trajflow.contracts.records import TrajectoryRecord
from trajflow.infra.store import LocalStore

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "agent"


def example_config(tmp_path: Path, train: str = "") -> Path:
    """The example's config with the stack's tiny model: the same task, program and reward."""
    text = (EXAMPLE / "config.toml").read_text().split("\n[demo]\n")[0]
    text = text.replace('name_or_path = "smollm2"', 'name_or_path = "tiny"')
    text = text.replace('env_path = "."', f'env_path = "{EXAMPLE}"')
    assert 'env_id = "agent:repo_agent:solve"' in text and str(EXAMPLE) in text
    path = tmp_path / "agent.toml"
    path.write_text(text + train)
    return path


def test_rollout_of_the_example_agent(cli_stack, tmp_path: Path) -> None:
    proc = cli_stack.trajflow("rollout", "-c", str(EXAMPLE / "config.toml"), "--seed", "2", "--json", timeout=900)
    out = json.loads(proc.stdout)
    assert out["status"] == "completed", out
    assert out["reward"] in (0.0, 1.0) and 1 <= out["turns"] <= 5, out
    assert "packaged" in proc.stderr
    record = TrajectoryRecord.model_validate(LocalStore(cli_stack.state_dir).get_json(out["trajectory_uri"]))
    first = json.loads(record.first_observation)  # the program's first chat request, as the endpoint received it
    assert first["call"] == 1 and first["messages"][0]["role"] == "system"
    assert "```bash" in first["messages"][0]["content"]
    assert record.context is not None and len(record.context.turn_spans) == out["turns"]
    for i, turn in enumerate(record.turns[:-1]):  # each request carries the answer before it, as sent
        request = json.loads(turn.observation)
        assert request["call"] == i + 2 and request["messages"][-2] == {"role": "assistant", "content": turn.action}
    assert record.turns[-1].observation == ""  # the program's exit ends the episode
    text = cli_stack.trajflow("rollout", "-c", str(EXAMPLE / "config.toml"), "--seed", "2", timeout=900).stdout
    assert "chat request 1 (2 messages), last user:" in text  # the transcript shows each request's newest message

    def trace() -> str | None:  # the trace view: each call, and the program's own time between calls
        out = cli_stack.trajflow("trace", out_id, check=False)
        return out.stdout if out.returncode == 0 and "where the time went" in out.stdout else None

    out_id = out["workflow_id"]
    timeline = wait_for(trace, 30, interval_s=0.5, what="the agent trajectory's spans")
    steps = [line for line in timeline.splitlines() if "env.step (turn" in line and "run env.step" not in line]
    assert len(steps) == out["turns"], timeline
    assert "call 2, program " in steps[0] and "the agent program between calls: " in timeline, timeline


def test_training_on_the_example_agent(cli_stack, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    train = (
        "\n[train]\nsteps = 2\nbatch_size = 8\ngroup_size = 4\nalpha = 1\n"
        "trainer = { lr = 1e-4, micro_batch = 8 }\neval = { episodes = 4 }\n"
    )
    config = example_config(tmp_path, train)
    cli_stack.trajflow("train", str(config), "--run-id", "agent-run", "--json-summary", str(out), timeout=1200)
    summary = json.loads(out.read_text())
    assert summary["steps"] == 2 and summary["trajectories_trained"] == 16, summary
    assert summary["eval_after"]["episodes"] == 4 and summary["eval_after"]["version"] == 2
    recorded = json.loads((cli_stack.state_dir / "runs" / "agent-run" / "config.json").read_text())
    assert recorded["tasks"][0]["env_package"].endswith(".tar")


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def other(task, seed):\n    return 0\n", "no function 'solve'"),
        ("class solve:\n    pass\n", "solve"),
    ],
    ids=["missing-function", "a-class"],
)
def test_a_bad_agent_program_is_refused_at_submission(tmp_path: Path, source: str, says: str) -> None:
    env = tmp_path / "agent"
    env.mkdir()
    (env / "mine.py").write_text(source)
    config = tmp_path / "bad.toml"
    config.write_text(f'[[tasks]]\nname = "mine"\nenv_id = "agent:mine:solve"\nenv_path = "{env}"\n')
    for proc in submitted_offline(config, tmp_path / "state"):
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr, proc.stderr
