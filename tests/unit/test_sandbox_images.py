"""Image naming, mirror discovery and the build lock of `trajflow.sandbox.images`, without Docker."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import cast

import docker
import pytest

from trajflow.sandbox import images


def test_base_tag_is_stable_and_named() -> None:
    assert images.base_image_tag() == images.base_image_tag()
    assert images.base_image_tag().startswith("trajflow-base:")


def test_runtime_tag_covers_base_wheels_and_runner_sources() -> None:
    wheels = {"gem_llm-0.1.0-py3-none-any.whl": "aa"}
    src = {"runner.py": b"print(1)", "shell.py": b"x = 1"}
    tag = images.runtime_image_tag("trajflow-base:1", wheels, src)
    assert tag.startswith("trajflow-runtime:")
    assert tag == images.runtime_image_tag("trajflow-base:1", dict(wheels), dict(src))
    assert tag != images.runtime_image_tag("trajflow-base:2", wheels, src)
    assert tag != images.runtime_image_tag("trajflow-base:1", {"gem_llm-0.1.0-py3-none-any.whl": "bb"}, src)
    assert tag != images.runtime_image_tag("trajflow-base:1", wheels, {**src, "runner.py": b"print(2)"})
    assert tag != images.runtime_image_tag("trajflow-base:1", wheels, {**src, "shell.py": b"x = 2"})
    assert tag != images.runtime_image_tag("trajflow-base:1", wheels, {**src, "gym_text.py": b"x = 3"})


def test_runtime_sources_are_the_runner_its_envs_the_env_id_prefixes_and_the_words_corpus() -> None:
    words = {"nltk_data/corpora/words/README", "nltk_data/corpora/words/en", "nltk_data/corpora/words/en-basic"}
    envs = {
        "runner.py",
        "gem_loader.py",
        "shell.py",
        "gym_adapter.py",
        "gym_text.py",
        "dataset.py",
        "verify.py",
        "agent.py",
        "agent_cmd.py",
        "agent_http.py",
        "agent_chat.py",
        "agent_messages.py",
        "agent_process.py",
        "agent_responses.py",
        "agent_verify.py",
    }
    assert set(images.runtime_sources()) == envs | {"env_ids.py"} | words
    text = images.runtime_dockerfile("trajflow-base:x", ["a.whl"])
    copied = (
        "runner.py gem_loader.py shell.py gym_adapter.py gym_text.py dataset.py verify.py agent.py agent_cmd.py "
        "agent_http.py agent_chat.py agent_messages.py agent_process.py agent_responses.py agent_verify.py env_ids.py"
    )
    assert f"COPY {copied} /opt/trajflow/" in text
    assert "COPY nltk_data/ /usr/share/nltk_data/" in text and "NLTK_DATA=/usr/share/nltk_data" in text


def test_runtime_tag_covers_the_words_corpus() -> None:
    src = images.runtime_sources()
    tag = images.runtime_image_tag("trajflow-base:1", {}, src)
    edited = {**src, "nltk_data/corpora/words/en-basic": src["nltk_data/corpora/words/en-basic"] + b"zebra\n"}
    assert tag != images.runtime_image_tag("trajflow-base:1", {}, edited)


def test_the_vendored_words_corpus_is_nltks_and_unchanged() -> None:
    """NLTK's own reader reads it as GEM's word games do, and every file has the SHA-256 its SOURCE.md records."""
    import hashlib
    import re

    from nltk.corpus.reader import WordListCorpusReader

    root = images.NLTK_DATA_DIR / "corpora" / "words"
    reader = WordListCorpusReader(str(root), ["en", "en-basic"])
    basic = reader.words("en-basic")
    assert len(basic) == 850 and len(reader.words("en")) == 235886
    assert "able" in basic and "zebra" not in basic  # Ogden's list has no zebra
    assert len([w for w in basic if len(w) == 5 and w.isalpha() and w.islower()]) > 100  # Wordle's candidates
    note = (images.NLTK_DATA_DIR / "SOURCE.md").read_text()
    recorded = {path: sha for sha, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", note, re.M)}
    assert recorded == {
        rel: hashlib.sha256((images.NLTK_DATA_DIR / rel).read_bytes()).hexdigest() for rel in images.NLTK_WORDS
    }


def test_task_layer_holds_the_task_but_not_its_solution() -> None:
    names = images.shell_task_names()
    assert len(names) >= 5
    for name in names:
        files = images.task_files(name)
        assert "task.json" in files and "solution.sh" not in files
        assert any(rel.startswith("repo/tests/") for rel in files), name
        assert not any("__pycache__" in rel for rel in files)


def test_task_tag_changes_only_with_its_inputs(tmp_path: Path) -> None:
    files = images.task_files("slugify")
    tag = images.task_image_tag("trajflow-runtime:1", "slugify", files)
    assert tag.startswith("trajflow-task:slugify-")
    assert tag == images.task_image_tag("trajflow-runtime:1", "slugify", dict(files))
    assert tag != images.task_image_tag("trajflow-runtime:2", "slugify", files)
    edited = {**files, "repo/text.py": files["repo/text.py"] + b"\n"}
    assert tag != images.task_image_tag("trajflow-runtime:1", "slugify", edited)
    assert images.task_dockerfile("trajflow-runtime:1", "slugify").startswith("FROM trajflow-runtime:1\n")


def test_unknown_or_unsafe_task_names_are_refused() -> None:
    for bad in ("no-such-task", "../etc", "Slugify", ""):
        with pytest.raises(images.UnknownTask, match="shipped ones are"):
            images.task_files(bad)


def test_dockerfile_installs_from_wheels_and_runs_the_runner() -> None:
    text = images.runtime_dockerfile("trajflow-base:x", ["pip-26.3-py3-none-any.whl", "a.whl"])
    assert text.startswith("FROM trajflow-base:x AS build")
    assert "python3 /w/pip-26.3-py3-none-any.whl/pip install --no-index --find-links /w" in text
    assert "'gem-llm==0.1.0'" in text and "'gymnasium==1.4.0'" in text
    assert "torch" not in text
    assert text.rstrip().endswith('CMD ["python3", "/opt/trajflow/runner.py"]')


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads ask for the image at once; the lock makes exactly one of them build each layer."""
    existing: set[str] = set()
    builds: list[str] = []
    wheels = {"pip-26.3-py3-none-any.whl": "00"}

    def fake_exists(_client: object, tag: str) -> bool:
        return tag in existing

    def fake_base(_client: object, _cache: Path, tag: str, _progress: object) -> None:
        builds.append("base")
        existing.add(tag)

    def fake_wheels(cache_dir: Path, _progress: object) -> dict[str, str]:
        builds.append("wheels")
        monkeypatch.setattr(images, "cached_wheels", lambda _cache: wheels)
        return wheels

    def fake_runtime(_client: object, _cache: Path, _base: str, tag: str, _progress: object) -> None:
        builds.append("runtime")
        existing.add(tag)

    monkeypatch.setattr(images, "image_exists", fake_exists)
    monkeypatch.setattr(images, "build_base_image", fake_base)
    monkeypatch.setattr(images, "download_wheels", fake_wheels)
    monkeypatch.setattr(images, "build_runtime_image", fake_runtime)
    monkeypatch.setattr(images, "cached_wheels", lambda _cache: None)

    tags: list[str] = []
    barrier = threading.Barrier(8)
    no_client = cast(docker.DockerClient, object())  # never called: every Docker step above is faked

    def call() -> None:
        barrier.wait()
        tags.append(images.ensure_runtime_image(no_client, tmp_path))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(builds) == ["base", "runtime", "wheels"]
    assert len(tags) == 8 and len(set(tags)) == 1
