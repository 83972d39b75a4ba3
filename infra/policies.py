"""Published policy weights in the object store: the trainer publishes, decode workers follow.

Layout under `runs/<run>/policy/` (keys from `trajflow.infra.layout`):
    v000003/<files of a Hugging Face checkpoint directory>
    v000003/manifest.json          written after the files: a version directory is complete once it exists
    latest.json                    {"version": 3, "weights": true} written last: the pointer decode workers read

A version is published by writing its files, then its manifest, then moving the pointer, so a reader never sees
a pointer to a half-written version. `PolicyStore` is also the `WeightSource` the engines use: `latest_version`
reads the pointer (cached for `pointer_ttl_s`), `latest` downloads a version once into a local cache directory.
A policy pinned to a version (`RUN@V`, `trajflow.contracts.trajectory.split_policy`) is served at exactly V, never the
newest: its version is V once V's manifest exists (0 before, so a request that needs V waits for it), and its
weights are V's (a missing V raises `ObjectNotFound` rather than serving other weights). Simulated runs
(benchmarks) publish pointers without weights (`weights: false`).

Each worker process downloads into its own cache directory, `<cache>/policies/<worker id>` (`host-pid-random`,
`trajflow.workers.common.new_worker_id`); `sweep_dead_worker_caches` removes those of this host's workers that no longer
run (a restarted stack would otherwise keep every old worker's weights: ~0.5 GB a version for SmolLM2 in float32).

A client that will still need an older version (`trajflow train`'s evals during training) holds it (`hold`, a small
object under `policy/holds/`) until it is done (`release`); `prune` keeps held versions. A hold left by a process
that died keeps its version until someone releases it (`trajflow attach` evaluates and releases it).

Not covered: garbage collection of a run's store objects beyond `prune` (keeping the newest few versions and the
held ones; an older version can no longer be served, pinned or not, unless a decode worker still has it in its
cache).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from trajflow.contracts.engines import PolicyWeights
from trajflow.contracts.trajectory import split_policy
from trajflow.infra.layout import (
    dir_file_key,
    manifest_key,
    policy_hold_key,
    policy_latest_key,
    policy_prefix,
    policy_version_prefix,
)
from trajflow.infra.store import ObjectNotFound, ObjectStore


class PolicyStore:
    def __init__(self, store: ObjectStore, cache_dir: Path, *, pointer_ttl_s: float = 0.5) -> None:
        self.store = store
        self.cache_dir = Path(cache_dir)
        self.pointer_ttl_s = pointer_ttl_s
        self._pointers: dict[str, tuple[float, int, bool]] = {}
        self._pinned_found: set[tuple[str, int]] = set()
        """Pinned versions seen complete in the store: a published version never changes, so they stay found."""
        self._lock = threading.Lock()

    # --- publishing (trainer side) ---------------------------------------------------------------------------

    def publish(self, run_id: str, version: int, directory: Path | None) -> str | None:
        """Upload a checkpoint directory as `version` of `run_id` and point `latest` at it; None publishes a
        version pointer without weights (simulated training). Returns the version's manifest URI."""
        prefix = policy_version_prefix(run_id, version)
        manifest_uri = put_dir(self.store, prefix, directory) if directory is not None else None
        self.store.put_json(policy_latest_key(run_id), {"version": version, "weights": directory is not None})
        with self._lock:
            self._pointers[run_id] = (time.monotonic(), version, directory is not None)
        return manifest_uri

    def prune(self, run_id: str, keep: int = 2) -> None:
        """Delete all but the newest `keep` published versions of a run and the held ones (the pointer's target is
        always kept)."""
        newest = self.latest_version(run_id, fresh=True)
        held = self.held(run_id)
        for uri in self.store.list(f"{policy_prefix(run_id)}/v"):
            name = uri.rsplit("/policy/", 1)[1].split("/", 1)[0]
            if name.startswith("v") and name[1:].isdigit() and int(name[1:]) <= newest - keep:
                if int(name[1:]) not in held:
                    self.store.delete(uri)

    def reserve(self, run_id: str, version: int) -> None:
        """Hold `version` of `run_id` before it is published, so that no prune can remove it between its publication
        and a `hold` that comes later (until `release`)."""
        self.store.put_json(policy_hold_key(run_id, version), {"version": version})

    def hold(self, run_id: str, version: int) -> bool:
        """Keep `version` of `run_id` from being pruned until `release`; False (and no hold) when its weights are not
        in the store any more. A prune that had already begun when the hold was written may still remove it."""
        self.reserve(run_id, version)
        if version in self.versions(run_id):
            return True
        self.release(run_id, version)
        return False

    def release(self, run_id: str, version: int) -> None:
        """End a hold (the next prune removes the version if it is old enough); nothing when there is none."""
        self.store.delete(self.store.uri_for(policy_hold_key(run_id, version)))

    def held(self, run_id: str) -> set[int]:
        """The versions of `run_id` that are held now."""
        names = (uri.rsplit("/", 1)[1] for uri in self.store.list(f"{policy_prefix(run_id)}/holds/v"))
        return {int(n[1:]) for n in names if n[1:].isdigit()}

    # --- following (decode side): the WeightSource protocol -------------------------------------------------

    def versions(self, run_id: str) -> list[int]:
        """The versions of `run_id` whose weights are in the store now (complete: their manifest exists), oldest
        first; pruned versions are gone."""
        found = set()
        for uri in self.store.list(f"{policy_prefix(run_id)}/v"):
            name, _, rest = uri.rsplit("/policy/", 1)[1].partition("/")
            if rest == "manifest.json" and name[1:].isdigit():
                found.add(int(name[1:]))
        return sorted(found)

    def latest_version(self, policy: str, *, fresh: bool = False) -> int:
        run, pinned = split_policy(policy)
        if pinned is not None:
            return pinned if self._pinned_exists(run, pinned) else 0
        return self._pointer(policy, fresh)[0]

    def latest(self, policy: str) -> PolicyWeights | None:
        run, pinned = split_policy(policy)
        if pinned is not None:
            return PolicyWeights(policy=policy, version=pinned, path=self.fetch(run, pinned)) if pinned else None
        version, has_weights = self._pointer(policy, False)
        if version == 0 or not has_weights:
            return None
        return PolicyWeights(policy=policy, version=version, path=self.fetch(policy, version))

    def _pinned_exists(self, run_id: str, version: int) -> bool:
        if version == 0 or (run_id, version) in self._pinned_found:
            return True
        prefix = policy_version_prefix(run_id, version)
        if not self.store.exists(self.store.uri_for(manifest_key(prefix))):
            return False
        with self._lock:
            self._pinned_found.add((run_id, version))
        return True

    def _pointer(self, policy: str, fresh: bool) -> tuple[int, bool]:
        if not policy:
            return 0, False
        now = time.monotonic()
        with self._lock:
            cached = self._pointers.get(policy)
        if cached and not fresh and now - cached[0] < self.pointer_ttl_s:
            return cached[1], cached[2]
        try:
            data = self.store.get_json(self.store.uri_for(policy_latest_key(policy)))
            version, weights = int(data["version"]), bool(data.get("weights", True))
        except ObjectNotFound:
            version, weights = 0, False
        with self._lock:
            self._pointers[policy] = (now, version, weights)
        return version, weights

    def fetch(self, run_id: str, version: int) -> Path:
        """The local directory of a published version, downloaded once (a complete copy or nothing)."""
        target = self.cache_dir / safe_name(run_id) / f"v{version:06d}"
        if (target / "manifest.json").is_file():
            return target
        get_dir(self.store, policy_version_prefix(run_id, version), target)
        self._prune_cache(run_id, keep_from=version - 1)
        return target

    def _prune_cache(self, run_id: str, keep_from: int) -> None:
        for old in (self.cache_dir / safe_name(run_id)).glob("v*"):
            if old.name[1:].isdigit() and int(old.name[1:]) < keep_from:
                shutil.rmtree(old, ignore_errors=True)


def put_dir(store: ObjectStore, prefix: str, directory: Path) -> str:
    """Upload the files of `directory` under `prefix`, then a manifest naming them; returns the manifest URI.
    A reader that finds the manifest finds every file."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file())
    for path in files:
        store.put_file(dir_file_key(prefix, path.name), path)
    return store.put_json(manifest_key(prefix), {"files": [p.name for p in files]})


def get_dir(store: ObjectStore, prefix: str, target: Path) -> Path:
    """Download what `put_dir` uploaded under `prefix` into `target` (replaced whole); ObjectNotFound if absent."""
    manifest = store.get_json(store.uri_for(manifest_key(prefix)))
    tmp = target.with_name(f".{target.name}-{uuid.uuid4().hex}")
    tmp.mkdir(parents=True)
    try:
        for name in manifest["files"]:
            (tmp / name).write_bytes(store.get_bytes(store.uri_for(dir_file_key(prefix, name))))
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def delete_prefix(store: ObjectStore, prefix: str) -> None:
    for uri in store.list(prefix):
        store.delete(uri)


def safe_name(run_id: str) -> str:
    """A run id as one safe path segment."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)


def sweep_dead_worker_caches(root: Path, host: str) -> list[Path]:
    """Remove the cache directories under `root` of `host`'s worker processes that are no longer running
    (named `host-pid-random`); other hosts' and live processes' are kept. Returns what was removed."""
    removed = []
    for path in root.glob(f"{host}-*-*") if root.is_dir() else []:
        name_host, pid, _ = path.name.rsplit("-", 2)
        if name_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
