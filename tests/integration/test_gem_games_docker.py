"""GEM's games in real sandboxes of the runtime image: the word games play on the NLTK `words` corpus that the image
ships (sandboxes have no network to download it), and every `game:` id of GEM's registry resets.

Needs a running Docker engine; the runtime image is built on first use (tests/conftest.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from gem.envs.registration import ENV_REGISTRY
from nltk.corpus.reader import WordListCorpusReader

from trajflow.sandbox.errors import EnvError, SandboxLost
from trajflow.sandbox.images import IMAGE_NLTK_DATA, NLTK_DATA_DIR
from trajflow.sandbox.manager import Sandbox, SandboxManager

pytestmark = pytest.mark.integration

WORDLE = "game:Wordle-v0-easy"
GEM_BUGS = {
    "game:Crosswords-v0-random": "GEM 0.1.0's constructor loads its words with hardcore=None: 'No words found'",
    "game:FifteenPuzzle-v0-random": "GEM 0.1.0's constructor squares num_rows=None: TypeError",
}
"""`game:` ids that GEM itself cannot make, on the host as in a sandbox (strict: a fixed GEM makes the test fail
until the entry goes)."""
GAME_IDS = [
    pytest.param(k, marks=pytest.mark.xfail(reason=GEM_BUGS[k], strict=True, raises=EnvError)) if k in GEM_BUGS else k
    for k in sorted(k for k in ENV_REGISTRY if k.startswith("game:"))
]


def wordle_feedback(guess: str, secret: str) -> str:
    """Wordle's marks (G right place, Y elsewhere in the word, X absent), each letter of the secret used once."""
    marks = ["G" if g == s else "" for g, s in zip(guess, secret, strict=True)]
    left = [s for s, m in zip(secret, marks, strict=True) if not m]
    for i, g in enumerate(guess):
        if not marks[i]:
            marks[i] = "Y" if g in left else "X"
            if g in left:
                left.remove(g)
    return "".join(marks)


@pytest.fixture()
def wordle(sandbox_manager: SandboxManager) -> Iterator[Sandbox]:
    box = sandbox_manager.start(WORDLE)
    try:
        yield box
    finally:
        sandbox_manager.close(box.id)


def test_wordle_plays_on_the_shipped_word_list(wordle: Sandbox) -> None:
    """A solver that knows only the vendored `en-basic` list wins: the sandbox's secret words are drawn from it."""
    basic = WordListCorpusReader(str(NLTK_DATA_DIR / "corpora" / "words"), ["en-basic"]).words("en-basic")
    candidates = sorted({w.upper() for w in basic if len(w) == 3 and w.isalpha() and w.islower()})
    reset = wordle.reset(WORDLE, 5, {})
    assert "You are playing Wordle." in reset["observation"] and "3-letter word" in reset["observation"]
    guesses = 0
    while guesses < 15:
        guess, guesses = candidates[0], guesses + 1
        step = wordle.step(f"My guess: \\boxed{{{guess}}}")
        if step["terminated"]:
            break
        marks = "".join(re.findall(r"'([GYX])'", step["observation"].splitlines()[-1]))
        assert len(marks) == 3, step["observation"]
        candidates = [w for w in candidates if wordle_feedback(guess, w) == marks]
        assert candidates, f"no word of en-basic fits the feedback {marks} to {guess}"
    assert step["observation"] == f"Congratulations! You guessed the secret word {guess} in {guesses} turns."
    assert step["reward"] > 0.5 and not step["truncated"]  # GEM pays 0.5 for the win, plus new green letters
    malformed = (wordle.reset(WORDLE, 5, {}), wordle.step("no box here"))[1]
    assert (malformed["reward"], malformed["terminated"]) == (-0.1, True)


def test_nltk_download_returns_without_a_network(wordle: Sandbox, docker_client) -> None:
    """GEM's word games call `nltk.download("words")` at every reset: offline, it fails at once and says so (False),
    and the corpus is read from the image's copy. (`timeout` only keeps a hang from hanging the test.)"""
    probe = (
        "import nltk; from nltk.corpus import words; print(nltk.download('words', quiet=True), "
        "len(words.words('en-basic')), len(words.words('en')), nltk.data.find('corpora/words'))"
    )
    container = docker_client.containers.get(wordle.container_id)
    code, out = container.exec_run(["timeout", "60", "python3", "-c", probe], user="65534:65534", demux=True)
    stdout, stderr = out
    assert code == 0, stderr
    assert stdout.decode().split() == ["False", "850", "235886", f"{IMAGE_NLTK_DATA}/corpora/words"]


SLOW_RESETS = {"game:Sokoban-v0-random": 600, "game:Sokoban-v0-hard": 600}
"""GEM's Sokoban builds its room by a depth-first search of up to 300,000 states whose length varies from call to call
for one seed: 0.04 s to 132 s for `Sokoban-v0-random` seed 1 in the runner on the 2-core EPYC (measured 2026-11-25).
The reproducibility check gives those resets room; a reset that outlives the sandbox's step timeout in a run is a
`SandboxStepTimeout` like any other."""


@pytest.fixture(scope="module")
def games_sandboxes(sandbox_manager: SandboxManager) -> Iterator[list[Sandbox]]:
    boxes = [sandbox_manager.start("game:")]
    try:
        yield boxes
    finally:
        for box in boxes:
            sandbox_manager.close(box.id)


@pytest.fixture()
def games_box(games_sandboxes: list[Sandbox], sandbox_manager: SandboxManager) -> Sandbox:
    """The module's `game:` sandbox, replaced once a game lost it (a failure is that game's, not every later one's)."""
    try:
        games_sandboxes[-1].request({"op": "ping"}, timeout_s=30)
    except (SandboxLost, EnvError):
        games_sandboxes.append(sandbox_manager.start("game:"))
    return games_sandboxes[-1]


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_every_game_resets_the_same_from_its_seed(games_box: Sandbox, env_id: str) -> None:
    reset = {"op": "reset", "env_id": env_id, "seed": 1, "env_kwargs": {}}
    timeout = SLOW_RESETS.get(env_id)
    first = games_box.request(reset, timeout_s=timeout)["observation"]
    assert first.strip() and games_box.request(reset, timeout_s=timeout)["observation"] == first
