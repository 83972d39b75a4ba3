"""`trajflow.lab.analysis.guess_the_number`: games read from hand-made records, the figures worked out by hand, the
targets drawn by the host's GEM, and the store layout `trajflow train`'s evals leave (`<run>-eval-v<V>-<i>`)."""

from __future__ import annotations

import sys

import pytest

from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryStatus, TurnSummary
from trajflow.infra.layout import trajectory_record_key
from trajflow.infra.store import LocalStore
from trajflow.lab.analysis import guess_the_number as gtn

ENV = "game:GuessTheNumber-v0-easy"


def _obs(guess: int, target: int, turn: int) -> str:
    if guess == target:
        return f"Congratulations! You guessed the correct number {target} in {turn} turns."
    hint = "lower" if guess > target else "higher"
    return f"At turn {turn}, you guessed {guess}, and the target number is {hint} than {guess}."


def _record(seed: int, target: int, actions: list[str], workflow_id: str = "w") -> TrajectoryRecord:
    turns = []
    for i, action in enumerate(actions, start=1):
        guess = gtn.guess_of(action)
        obs = _obs(guess, target, i) if guess is not None else f"At turn {i}, you did not provide a valid guess."
        turns.append(
            TurnSummary(
                action=action,
                observation=obs,
                env_reward=1.0 if guess == target else 0.0,
                policy_version=0,
                completion_tokens=5,
                decode_pool="default",
            )  # fmt: skip
        )
    return TrajectoryRecord(
        workflow_id=workflow_id, request=TrajectoryRequest(env_id=ENV, seed=seed), status=TrajectoryStatus.COMPLETED,
        reward=1.0 if turns and turns[-1].env_reward == 1.0 else 0.0, first_observation="You are playing...",
        turns=turns, context=None, env_recoveries=0,
    )  # fmt: skip


def test_guess_is_the_last_boxed_number() -> None:
    assert gtn.guess_of("I think \\boxed{3}, no, \\boxed{7}") == 7
    assert gtn.guess_of("seven") is None


def test_follows_reads_each_guess_against_the_hint_before_it() -> None:
    # target 2: 7 (lower) -> 4 follows; 4 (lower) -> 5 does not; 5 (lower) -> 2 follows and wins
    game = gtn.game_of(_record(0, 2, ["\\boxed{7}", "\\boxed{4}", "\\boxed{5}", "\\boxed{2}"]), 2)
    assert game.guesses == [7, 4, 5, 2]
    assert game.hints == ["lower", "lower", "lower", None]
    assert game.follows() == [True, False, True]
    assert game.won


def test_a_missing_guess_after_a_hint_does_not_follow_it() -> None:
    game = gtn.game_of(_record(0, 9, ["\\boxed{7}", "no idea"]), 9)
    assert game.follows() == [False]


def test_summary_by_hand() -> None:
    games = [
        gtn.game_of(_record(0, 2, ["\\boxed{7}", "\\boxed{4}", "\\boxed{3}", "\\boxed{2}"]), 2),  # won, low, 3 follow
        gtn.game_of(_record(1, 5, ["\\boxed{7}", "\\boxed{8}", "\\boxed{9}", "\\boxed{10}"]), 5),  # lost, low, 0/3
        gtn.game_of(_record(2, 8, ["\\boxed{7}", "\\boxed{8}"]), 8),  # won, high, 1/1
        gtn.game_of(_record(3, 9, ["\\boxed{9}"]), 9),  # won at once, high: no hint to follow
    ]
    report = gtn.summarise(games, split=6)
    assert (report.games, report.wins) == (4, 3)
    assert report.by_target == {2: (1, 1), 5: (0, 1), 8: (1, 1), 9: (1, 1)}
    assert (report.low_rate, report.high_rate) == (0.5, 1.0)
    # second guesses with a hint before them: games 0 (4 < 7 after "lower": follows), 1 (8 > 7 after "lower":
    # not), 2 (8 > 7 after "higher": follows)
    assert report.second_follow == (2, 3)
    # by the first hint: games 0 and 1 got "lower" (one followed), game 2 got "higher" (followed)
    assert report.second_by_hint == {"higher": (1, 1), "lower": (1, 2)}
    # every guess after a hint: game 0 three of three, game 1 none of three, game 2 one of one
    assert report.later_follow == (4, 7)
    assert report.first_guesses == {"7": 3, "9": 1}
    out = report.to_json()
    assert out["second_guess_follows_hint_share"] == pytest.approx(2 / 3)
    assert out["success"] == 0.75
    text = gtn.format_report(report, "run v1")
    assert "3/4 won" in text and "2/3 (67%) (after higher 1/1 (100%), after lower 1/2 (50%))" in text


def test_targets_come_from_gem_and_must_agree_with_a_win() -> None:
    target = gtn.target_of(ENV, 1_000_000)
    assert 1 <= target <= 10
    assert gtn.target_of(ENV, 1_000_000) == target  # seeded: the same draw every time
    wrong = target % 10 + 1
    with pytest.raises(gtn.AnalysisError, match="GEM here draws"):
        gtn.game_of(_record(1_000_000, wrong, [f"\\boxed{{{wrong}}}"]), target)
    with pytest.raises(gtn.AnalysisError, match="not a Guess The Number env"):
        gtn.target_of("game:Minesweeper-v0-easy", 0)


def test_without_gem_on_the_host_the_analysis_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gem", None)  # `import gem` raises ImportError, as where it is not installed
    with pytest.raises(gtn.AnalysisError, match=r"pip install 'trajflow\[analysis\]'"):
        gtn.target_of(ENV, 1_000_000)


def test_eval_records_reads_greedy_trajectories_of_one_eval(tmp_path) -> None:
    store = LocalStore(tmp_path)
    run = "run-abc"
    for version in (0, 3):
        for i in range(3):
            seed = 1_000_000 + i
            target = gtn.target_of(ENV, seed)
            for wid in (f"{run}-eval-v{version}-{i}", f"{run}-eval-v{version}-{i}-k0"):
                record = _record(seed, target, [f"\\boxed{{{target}}}"], wid)
                store.put_json(trajectory_record_key(wid, "r1"), record)
    store.put_json(trajectory_record_key(f"{run}-eval-v30-1", "r1"), _record(5, 5, [], "x"))
    assert list(gtn.eval_prefixes(store, run)) == [0, 3, 30]
    records = gtn.eval_records(store, gtn.eval_prefix(run, 3))
    assert [r.workflow_id for r in records] == [f"{run}-eval-v3-{i}" for i in range(3)]  # no -k0 samples
    report = gtn.summarise(gtn.games_of(records))
    assert (report.games, report.wins) == (3, 3)


def test_the_evals_during_training_are_found_too(tmp_path) -> None:
    """`<run>-curve-v<V>-<hex>-<i>` (one hex per attempt): the attempt with the most episodes is read, and a version
    also evaluated before or after training is read from that eval."""
    store = LocalStore(tmp_path)
    run = "run-abc"
    attempts = {(6, "0a1c5b"): 2, (6, "ffe001"): 3, (12, "123abc"): 1, (0, "aaaaaa"): 1}
    for (version, attempt), episodes in attempts.items():
        for i in range(episodes):
            for wid in (f"{run}-curve-v{version}-{attempt}-{i}", f"{run}-curve-v{version}-{attempt}-{i}-k0"):
                store.put_json(trajectory_record_key(wid, "r1"), _record(i, 3, ["\\boxed{3}"], wid))
                store.put_json(trajectory_record_key(wid, "r2"), _record(i, 3, ["\\boxed{3}"], wid))  # a retry
    store.put_json(trajectory_record_key(f"{run}-eval-v0-0", "r1"), _record(0, 3, [], f"{run}-eval-v0-0"))
    store.put_json(trajectory_record_key("run-abcd-curve-v9-abcdef-0", "r1"), _record(0, 3, [], "other run"))
    assert gtn.eval_prefixes(store, run) == {
        0: f"{run}-eval-v0",
        6: f"{run}-curve-v6-ffe001",
        12: f"{run}-curve-v12-123abc",
    }
    assert len(gtn.eval_records(store, f"{run}-curve-v6-ffe001")) == 3


def test_plot_writes_a_png(tmp_path) -> None:
    games = [gtn.game_of(_record(0, 2, ["\\boxed{2}"]), 2)]
    path = tmp_path / "by_target.png"
    gtn.plot_report({"v0": gtn.summarise(games), "v18": gtn.summarise(games)}, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
