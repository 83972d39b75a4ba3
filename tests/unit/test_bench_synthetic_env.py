"""trajflow.lab.bench.synthetic_env: episode lengths are uniform in [min, max] turns and end at the last turn; step
delays are a Gaussian clipped at 0 with the expected mean; a seed replays the same episode."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from trajflow.lab.bench.synthetic_env import SyntheticEpisode, SyntheticSpec, episode_seed


def test_turns_are_uniform_from_one_to_eight() -> None:
    spec = SyntheticSpec()
    counts = Counter(SyntheticEpisode(spec, seed).turns for seed in range(8000))
    assert set(counts) == set(range(1, 9))
    assert all(800 <= n <= 1200 for n in counts.values()), counts


def test_the_episode_terminates_at_its_last_turn() -> None:
    ep = SyntheticEpisode(SyntheticSpec(mean=1.0, sigma=1.0), seed=3)
    ep.reset()
    steps = [ep.step("move") for _ in range(ep.turns)]
    assert [s.terminated for s in steps] == [False] * (ep.turns - 1) + [True]
    assert steps[-1].reward in (0.0, 1.0) and all(s.reward == 0.0 for s in steps[:-1])
    assert ep.done
    with pytest.raises(ValueError):
        ep.step("one more")


@pytest.mark.parametrize("sigma", [1.0, 5.0, 10.0])
def test_delays_are_a_gaussian_clipped_at_zero(sigma: float) -> None:
    spec = SyntheticSpec(mean=5.0, sigma=sigma, min_turns=8, max_turns=8)
    delays = [s.delay_units for seed in range(3000) for s in _run(SyntheticEpisode(spec, seed))]
    assert min(delays) >= 0.0
    assert statistics.fmean(delays) == pytest.approx(spec.mean_delay, rel=0.04)
    if sigma == 10.0:
        assert 0.25 < sum(d == 0.0 for d in delays) / len(delays) < 0.37  # P(N(5, 10) < 0) = 0.31


def test_clipped_mean_formula() -> None:
    assert SyntheticSpec(mean=5.0, sigma=0.0).mean_delay == 5.0
    assert SyntheticSpec(mean=5.0, sigma=1.0).mean_delay == pytest.approx(5.0, abs=1e-5)
    assert SyntheticSpec(mean=5.0, sigma=10.0).mean_delay == pytest.approx(6.978, abs=1e-3)


def test_a_seed_replays_the_same_episode_and_ids_give_each_sample_its_own() -> None:
    spec = SyntheticSpec(mean=2.0, sigma=3.0)
    a, b = SyntheticEpisode(spec, 42), SyntheticEpisode(spec, 42)
    assert a.turns == b.turns and _run(a) == _run(b)
    assert episode_seed(5, "run-g000001-0") == episode_seed(5, "run-g000001-0")
    seeds = {episode_seed(5, f"run-g000001-{i}") for i in range(8)}
    assert len(seeds) == 8  # the members of one group (one task seed) get different episodes


def test_kwargs_round_trip_and_typos_are_refused() -> None:
    spec = SyntheticSpec(mean=3.0, sigma=2.0, min_turns=2, max_turns=4)
    assert SyntheticSpec.from_kwargs(spec.as_kwargs()) == spec
    assert SyntheticSpec.from_kwargs({}) == SyntheticSpec()
    with pytest.raises(ValueError, match="sigm"):
        SyntheticSpec.from_kwargs({"sigm": 1.0})
    with pytest.raises(ValueError):
        SyntheticSpec(min_turns=0)
    with pytest.raises(ValueError):
        SyntheticSpec(sigma=-1.0)


def _run(ep: SyntheticEpisode) -> list:
    return [ep.step("x") for _ in range(ep.turns)]
