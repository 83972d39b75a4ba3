"""`trajflow eval`'s pure parts: the pass@k estimator against hand-computed values, the figures and the per-seed
table from rows, the JSON it writes read back, `--policy` parsing, and finding a run's version in a real local
store (with the errors that list what exists)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajflow.cli.commands.evaluate import format_table, mean_pass_at_k, pass_at_k, shown_ks, summarise_eval
from trajflow.cli.commands.policy_eval import (
    EvalError,
    PolicySpec,
    parse_policy,
    report,
    resolve_version,
    runs_with_policies,
)
from trajflow.contracts.runs import EpisodeEval, EvalResult
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import LocalStore


def test_pass_at_k_matches_hand_computed_values() -> None:
    # n = 4 samples, c = 1 win: 1 - C(3, k) / C(4, k)
    assert pass_at_k(4, 1, 1) == pytest.approx(1 - 3 / 4)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(4, 1, 3) == pytest.approx(1 - 1 / 4)
    assert pass_at_k(4, 1, 4) == 1.0  # any 4 of 4 include the win
    # n = 5, c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 0.7 = Chen et al.'s product form 1 - (1 - 2/4)(1 - 2/5)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - (1 - 2 / 4) * (1 - 2 / 5))
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 8, 1) == 1.0
    for n, c in ((10, 3), (7, 1), (64, 5)):
        assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the plain success rate
        values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert values == sorted(values)  # more tries never lower it
    # large n: exact integers, no overflow or cancellation
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_over_seeds() -> None:
    got = mean_pass_at_k([1, 4, 0], 4)
    assert set(got) == {1, 2, 3, 4}
    assert got[1] == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    assert got[2] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert got[4] == pytest.approx(2 / 3)
    assert mean_pass_at_k([0, 0], 0) == {} and mean_pass_at_k([], 3) == {}
    assert shown_ks(0) == [] and shown_ks(1) == [1] and shown_ks(4) == [1, 2, 4] and shown_ks(6) == [1, 2, 4, 6]


def _rows() -> list[EpisodeEval]:
    completed, infra = TrajectoryStatus.COMPLETED, TrajectoryStatus.INFRA_FAILED
    return [
        EpisodeEval(seed=100, task="guess", greedy_status=completed, greedy_reward=1.0, greedy_win=True,
                    sample_wins=1, sample_rewards=[1.0, -0.5, 0.0, None]),
        EpisodeEval(seed=101, task="guess", greedy_status=completed, greedy_reward=-0.5, greedy_win=False,
                    sample_wins=4, sample_rewards=[1.0, 1.0, 1.0, 1.0]),
        EpisodeEval(seed=102, task="guess", greedy_status=infra, greedy_reward=None, greedy_win=False,
                    sample_wins=0, sample_rewards=[0.0, 0.0, 0.0, 0.0]),
    ]  # fmt: skip


def test_figures_table_and_json_from_the_rows(tmp_path: Path) -> None:
    result = summarise_eval(_rows(), "run-a", 3, 4, 1.0, 12.34)
    assert (result.episodes, result.scored, result.not_completed) == (3, 2, 1)
    assert result.success_rate == pytest.approx(1 / 3)  # the infra-failed greedy episode is a loss
    assert result.mean_reward == pytest.approx(0.25)  # of the scored ones
    assert result.pass_at_k[1] == pytest.approx(5 / 12) and result.pass_at_k[4] == pytest.approx(2 / 3)
    assert (result.policy, result.version, result.samples, result.temperature, result.seconds) == (
        "run-a",
        3,
        4,
        1.0,
        12.3,
    )

    table = format_table(result).splitlines()
    assert table[0].split() == ["SEED", "TASK", "GREEDY", "REWARD", "WIN", "SAMPLE", "WINS"]
    assert table[1].split() == ["100", "guess", "completed", "1.000", "yes", "1/4"]
    assert table[3].split() == ["102", "guess", "infra_failed", "-", "no", "0/4"]
    assert (
        table[-1] == "eval run-a v3: success 1/3 (33%), mean reward 0.250, pass@1 0.42, pass@2 0.50, pass@4 0.67 (12s)"
    )

    path = tmp_path / "out" / "eval.json"
    assert report(result, path) == format_table(result)
    data = json.loads(path.read_text())
    assert data["pass_at_k"] == {
        "1": pytest.approx(5 / 12),
        "2": 0.5,
        "3": pytest.approx(7 / 12),
        "4": pytest.approx(2 / 3),
    }
    assert data["per_episode"][0] == {
        "seed": 100, "task": "guess", "greedy_status": "completed", "greedy_reward": 1.0, "greedy_win": True,
        "sample_wins": 1, "sample_rewards": [1.0, -0.5, 0.0, None],
    }  # fmt: skip
    assert EvalResult.model_validate_json(path.read_text()) == result


def test_greedy_only_and_older_summaries_still_read() -> None:
    greedy = summarise_eval(_rows()[:2], "", 0, 0, 1.0, 1.0)
    assert greedy.pass_at_k == {} and greedy.temperature is None and greedy.samples == 0
    assert "SAMPLE" not in format_table(greedy) and format_table(greedy).endswith(
        "success 1/2 (50%), mean reward 0.250 (1s)"
    )
    # an eval result written before the per-seed table and pass@k existed still reads (the summary.json of old runs)
    old = {
        "version": 0,
        "episodes": 4,
        "scored": 4,
        "not_completed": 0,
        "success_rate": 0.25,
        "mean_reward": 0.1,
        "seconds": 3.0,
    }
    assert EvalResult.model_validate(old).per_episode == []


def test_parse_policy() -> None:
    assert parse_policy(None) == PolicySpec()
    assert parse_policy("run-a") == PolicySpec("run-a", None)
    assert parse_policy("run-a@0") == PolicySpec("run-a", 0)
    assert parse_policy("run-a@12") == PolicySpec("run-a", 12)
    for bad in ("", "@3", "run-a@", "run-a@v3", "run-a@-1", "run-a@1@2", "run-a@1.5"):
        with pytest.raises(ValueError, match="expected RUN or RUN@VERSION"):
            parse_policy(bad)


def test_resolve_version_in_a_store_and_the_errors_that_list_what_exists(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    policies = PolicyStore(store, tmp_path / "cache")
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"not read here")
    for version in (1, 2, 3):
        policies.publish("run-a", version, weights)
    policies.prune("run-a", keep=2)
    policies.publish("sim-run", 1, None)  # a benchmark's simulated run: a pointer without weights

    assert runs_with_policies(store) == ["run-a", "sim-run"]
    assert resolve_version(store, policies, PolicySpec()) == 0  # the base model
    assert resolve_version(store, policies, PolicySpec("run-a")) == 3  # the newest
    assert resolve_version(store, policies, PolicySpec("run-a", 2)) == 2
    assert resolve_version(store, policies, PolicySpec("run-a", 0)) == 0  # the run's initial model
    with pytest.raises(
        EvalError, match=r"no weights of version 1 .* newest is v3, the versions still there are v2, v3"
    ):
        resolve_version(store, policies, PolicySpec("run-a", 1))  # pruned
    with pytest.raises(EvalError, match="no weights of version 9"):
        resolve_version(store, policies, PolicySpec("run-a", 9))
    with pytest.raises(EvalError, match="no run 'nope' has published a policy .* runs that have: run-a, sim-run") as e:
        resolve_version(store, policies, PolicySpec("nope"))
    assert e.value.code == 2
    with pytest.raises(EvalError, match="simulated"):
        resolve_version(store, policies, PolicySpec("sim-run"))
    with pytest.raises(EvalError, match="no run has published one yet"):
        resolve_version(LocalStore(tmp_path / "empty"), policies, PolicySpec("run-a"))
