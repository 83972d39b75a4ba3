"""How a Guess The Number policy plays, read from its held-out eval trajectories: success by target, and whether its
guesses after the first move the way the game's hint says.

- **Target.** A seed's target is the number GEM's env draws for it: the env is made here, on the host, and reset with
  the seed (`target_of`), as the sandbox does. A won game names it too ("You guessed the correct number N"); the two
  must agree, else `AnalysisError` (a GEM on the host that draws differently from the sandbox's).
- **Guess.** The last `\\boxed{N}` of an action, the env's own rule; an action without one is no guess.
- **Hint.** "the target number is higher than 7" after a guess of 7. A later guess *follows the hint* when it lies on
  the hinted side of the guess that got it (above 7 here); the share is reported for second guesses (the first
  guess's hint) and for every guess after a hint.
- **Split.** Success on low targets (1..`split`) against high ones (above it): a policy that walks a fixed sequence
  from the top wins only the high ones.

Pure functions over `TrajectoryRecord`s, so the arithmetic is unit-tested on hand-made games; `eval_records` reads
an eval's greedy trajectories from the store (workflow ids `<run>-eval-v<V>-<i>` before and after training and
`<run>-curve-v<V>-<hex>-<i>` during it; `trajflow.cli.commands.evaluate`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from trajflow.contracts.records import TrajectoryRecord
from trajflow.rewards.registry import HINT

GUESS = re.compile(r"\\boxed\{(\d+)\}")
WON = re.compile(r"You guessed the correct number (\d+)")
DEFAULT_SPLIT = 6
"""Targets 1-6 against 7-10: the issue's split for the 1-10 game."""


class AnalysisError(ValueError):
    """The trajectories cannot be read as games of Guess The Number (or their targets disagree)."""


def guess_of(action: str) -> int | None:
    """The env's reading of an action: the number in its last `\\boxed{}` (None without one)."""
    found = GUESS.findall(action)
    return int(found[-1]) if found else None


@dataclass(frozen=True)
class Game:
    """One episode: its seed, target, guesses in order (None: no boxed number) and the hints they got."""

    seed: int
    target: int
    guesses: list[int | None]
    hints: list[str | None]
    """`higher`/`lower` after each guess (None: no hint, e.g. the winning guess or an invalid one)."""
    won: bool

    def follows(self) -> list[bool]:
        """For each guess after a hinted one: whether it lies on the hinted side of that guess."""
        out = []
        for i in range(1, len(self.guesses)):
            before, hint, now = self.guesses[i - 1], self.hints[i - 1], self.guesses[i]
            if before is None or hint is None:
                continue
            out.append(now is not None and (now > before if hint == "higher" else now < before))
        return out


def game_of(record: TrajectoryRecord, target: int) -> Game:
    """The game a trajectory played, against `target` (the seed's, `target_of`)."""
    guesses = [guess_of(turn.action) for turn in record.turns]
    hints: list[str | None] = []
    won = False
    for turn in record.turns:
        hint = HINT.search(turn.observation)
        hints.append(hint.group(1) if hint else None)
        if (named := WON.search(turn.observation)) is not None:
            won = True
            if int(named.group(1)) != target:
                raise AnalysisError(
                    f"seed {record.request.seed}: the game was won on {named.group(1)}, but GEM here draws "
                    f"{target} for it; the host's GEM differs from the sandbox's"
                )
    return Game(seed=record.request.seed, target=target, guesses=guesses, hints=hints, won=won)


def target_of(env_id: str, seed: int) -> int:
    """The target GEM's env draws for `seed` (GEM imported here, on the host: the `analysis` extra, in `all`)."""
    try:
        import gem
    except ImportError:
        raise AnalysisError(
            "GEM is not installed on this host, and it draws each seed's target: pip install 'trajflow[analysis]' "
            "(`make demo` and `make setup` install it)"
        ) from None

    env = gem.make(env_id)
    env.reset(seed=seed)
    target = getattr(env.unwrapped, "game_number", None)
    if target is None:
        raise AnalysisError(f"{env_id} is not a Guess The Number env (its env draws no game_number)")
    return int(target)


@dataclass
class PlayReport:
    """What the games show; rates are None where no game counts."""

    games: int
    wins: int
    by_target: dict[int, tuple[int, int]]
    """target -> (wins, games)."""
    split: int
    low_rate: float | None
    high_rate: float | None
    second_follow: tuple[int, int]
    """Second guesses on the hinted side of the first, over second guesses that had a hint to follow."""
    later_follow: tuple[int, int]
    """The same for every guess after a hinted one."""
    second_by_hint: dict[str, tuple[int, int]] = field(default_factory=dict)
    """`second_follow` split by the first guess's hint (`higher`, `lower`): a fixed walk up from the bottom is always
    on the hinted side after "higher" and never gets "lower", so only both together show hints being used."""
    first_guesses: dict[str, int] = field(default_factory=dict)
    """How often each first guess was made ("none": no boxed number)."""

    def to_json(self) -> dict:
        def rate(pair: tuple[int, int]) -> float | None:
            return pair[0] / pair[1] if pair[1] else None

        return {
            "games": self.games,
            "wins": self.wins,
            "success": self.wins / self.games if self.games else None,
            "by_target": {str(t): {"wins": w, "games": n} for t, (w, n) in sorted(self.by_target.items())},
            "split": self.split,
            "low_success": self.low_rate,
            "high_success": self.high_rate,
            "second_guess_follows_hint": {"count": self.second_follow[0], "of": self.second_follow[1]},
            "second_guess_follows_hint_share": rate(self.second_follow),
            "second_guess_follows_hint_by_hint": {
                h: {"count": k, "of": n} for h, (k, n) in self.second_by_hint.items()
            },
            "later_guesses_follow_hint": {"count": self.later_follow[0], "of": self.later_follow[1]},
            "later_guesses_follow_hint_share": rate(self.later_follow),
            "first_guesses": self.first_guesses,
        }


def summarise(games: Sequence[Game], split: int = DEFAULT_SPLIT) -> PlayReport:
    """Success by target and on each side of `split`, and the hint-following shares (module docstring)."""
    by_target: dict[int, tuple[int, int]] = {}
    for g in games:
        w, n = by_target.get(g.target, (0, 0))
        by_target[g.target] = (w + g.won, n + 1)

    def side_rate(low: bool) -> float | None:
        side = [g for g in games if (g.target <= split) == low]
        return sum(g.won for g in side) / len(side) if side else None

    hinted = [g for g in games if g.follows() and g.hints[0] is not None and g.guesses[0] is not None]
    seconds = [g.follows()[0] for g in hinted]
    by_hint = {
        hint: (sum(g.follows()[0] for g in hinted if g.hints[0] == hint), sum(g.hints[0] == hint for g in hinted))
        for hint in ("higher", "lower")
    }
    later = [f for g in games for f in g.follows()]
    firsts = Counter("none" if not g.guesses or g.guesses[0] is None else str(g.guesses[0]) for g in games)
    return PlayReport(
        games=len(games),
        wins=sum(g.won for g in games),
        by_target=by_target,
        split=split,
        low_rate=side_rate(True),
        high_rate=side_rate(False),
        second_follow=(sum(seconds), len(seconds)),
        second_by_hint=by_hint,
        later_follow=(sum(later), len(later)),
        first_guesses=dict(firsts.most_common()),
    )


def format_report(report: PlayReport, title: str) -> str:
    """A few lines a person reads: success overall and by target, the split, the hint-following shares."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    def share(pair: tuple[int, int]) -> str:
        return f"{pair[0]}/{pair[1]} ({pct(pair[0] / pair[1] if pair[1] else None)})"

    targets = "  ".join(f"{t}:{w}/{n}" for t, (w, n) in sorted(report.by_target.items()))
    firsts = ", ".join(f"{g} x{n}" for g, n in report.first_guesses.items())
    return "\n".join(
        [
            f"{title}: {report.wins}/{report.games} won",
            f"  by target (wins/games): {targets}",
            f"  targets 1-{report.split}: {pct(report.low_rate)}   targets above {report.split}: "
            f"{pct(report.high_rate)}",
            f"  second guesses on the hinted side: {share(report.second_follow)} (after higher "
            f"{share(report.second_by_hint.get('higher', (0, 0)))}, after lower "
            f"{share(report.second_by_hint.get('lower', (0, 0)))})",
            f"  every guess after a hint, on its side: {share(report.later_follow)}",
            f"  first guesses: {firsts}",
        ]
    )


def eval_prefix(run_id: str, version: int) -> str:
    """The workflow-id prefix of `trajflow train`'s eval of `version` before or after training
    (`trajflow.cli.commands.evaluate`)."""
    return f"{run_id}-eval-v{version}"


def eval_prefixes(store, run_id: str) -> dict[int, str]:
    """Every eval of run `run_id` that `trajflow train` made, version -> workflow-id prefix, from the trajectories in
    the store: the evals before and after (`<run>-eval-v<V>`) and those during training (`<run>-curve-v<V>-<hex>`,
    `trajflow.cli.commands.eval_curve`; a fresh hex per attempt, so of a version evaluated twice, by a process that
    died and the attach after it, the attempt with the most episodes counts). Where a version has both, the eval
    before or after (on more seeds) is the one read."""
    attempts: dict[tuple[int, str], set[str]] = defaultdict(set)  # (version, prefix) -> its episodes' indices
    for uri in store.list(f"trajectories/{run_id}-curve-v"):
        if (m := re.search(re.escape(run_id) + r"-curve-v(\d+)-([0-9a-f]+)-(\d+)/", uri)) is not None:
            attempts[int(m.group(1)), f"{run_id}-curve-v{m.group(1)}-{m.group(2)}"].add(m.group(3))
    found = {version: prefix for (version, prefix), _ in sorted(attempts.items(), key=lambda item: len(item[1]))}
    for uri in store.list(f"trajectories/{run_id}-eval-v"):
        if (m := re.search(re.escape(run_id) + r"-eval-v(\d+)-\d+/", uri)) is not None:
            found[int(m.group(1))] = eval_prefix(run_id, int(m.group(1)))
    return dict(sorted(found.items()))


def eval_records(store, prefix: str) -> list[TrajectoryRecord]:
    """The greedy trajectories of the eval whose workflow ids are `<prefix>-<i>` (the newest record of each), by
    seed; its sampled episodes (`<prefix>-<i>-k<j>`) are left out."""
    newest: dict[str, str] = {}
    for uri in store.list(f"trajectories/{prefix}-"):
        if not uri.endswith("/trajectory.json"):
            continue
        workflow_id = uri.rsplit("/", 3)[-3]
        if re.fullmatch(re.escape(prefix) + r"-\d+", workflow_id):
            newest[workflow_id] = max(newest.get(workflow_id, ""), uri)
    records = [TrajectoryRecord.model_validate(store.get_json(uri)) for uri in newest.values()]
    return sorted(records, key=lambda r: r.request.seed)


def games_of(records: Sequence[TrajectoryRecord]) -> list[Game]:
    """Each record's game, against its seed's target (`target_of`, once per env and seed)."""
    targets: dict[tuple[str, int], int] = {}
    games = []
    for record in records:
        key = (record.request.env_id, record.request.seed)
        if key not in targets:
            targets[key] = target_of(*key)
        games.append(game_of(record, targets[key]))
    return games


def plot_report(reports: dict[str, PlayReport], path: str) -> None:
    """Success by target, one bar series per report (e.g. before and after training), saved as PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = sorted({t for r in reports.values() for t in r.by_target})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(1, len(reports))
    for k, (label, report) in enumerate(reports.items()):
        rates = [report.by_target[t][0] / report.by_target[t][1] if t in report.by_target else 0.0 for t in targets]
        ax.bar([t + (k - (len(reports) - 1) / 2) * width for t in targets], rates, width, label=label)
    ax.set_xticks(targets)
    ax.set_xlabel("target")
    ax.set_ylabel("greedy success")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("Guess The Number: held-out success by target")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
