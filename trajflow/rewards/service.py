"""The reward service: a stateless HTTP app that scores finished episodes with registered reward functions.

Routes:
- `POST /score`: a `ScoreRequest` JSON body → a `ScoreResult`. An unknown `reward_fn` → 404; a body that is
  not JSON, has wrong types or unknown fields → 422. Every error body is JSON with a `message` that says what
  is wrong (and, for 404, `known`: the registered names; for 422, `detail`: pydantic's per-field errors).
  `reward_fn = "model:NAME"` scores with the request's `reward_model` (`trajflow.rewards.model_rewards`): an LLM judge
  or a local reward-model server that is down → 503, one that answers no score → 502, never a zero reward.
  A verifier (a reward function registered bounded: `math_verify`, `exact_match`, `regex_match`, your own) runs in a
  worker process under a time limit (`trajflow.rewards.bounded`; `--verifier-timeout-s`, `$TRAJFLOW_VERIFIER_TIMEOUT_S`,
  5 s by default): past it, the worker is killed and the answer is 422 with `error: "VerifierTimedOut"`, never a
  score (the client raises `RewardVerifierTimedOut`; the trajectory ends `failed`).
- `GET /healthz` → `{"ok": true}` (readiness / liveness).
- `GET /reward-fns` → the registered names, a JSON list of strings (reward models, `model:NAME`, are not listed: they
  are named by the run config, not registered here).

Stateless: nothing is kept between requests, so it runs unchanged on any platform that serves an HTTP
container (Cloud Run, Knative, Lambda web adapters, a k8s Deployment) and scales out by running more copies.
Run it with `python -m trajflow.rewards.service [--host H] [--port N] [--workers W] [--verifier-timeout-s S]
[--verifier-processes P]`; host and port default to `$HOST` and `$PORT` (as container platforms set them), else
127.0.0.1:8080. Each of the W serving processes keeps up to P verifier worker processes (default: the CPU count).

Not covered: authentication, TLS and rate limiting (the platform in front provides them). Reward models run
elsewhere (a judge's inference server, `trajflow reward-model serve`); this service only calls them.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from trajflow.contracts import names
from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.rewards import bounded, model_rewards, registry
from trajflow.rewards.model_http import RewardModelFailed, RewardModelUnavailable

log = logging.getLogger(__name__)


class RewardFnFailed(Exception):
    """A reward function raised or returned garbage: a bug on the service's side (answered as 500)."""


def _field_errors(exc: RequestValidationError) -> str:
    """`body.seed: Input should be a valid integer; body.x: Extra inputs are not permitted` from pydantic errors."""
    parts = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid":  # loc is ("body", character offset), not a field
            reason = (err.get("ctx") or {}).get("error", "")
            parts.append(f"body is not valid JSON (at character {loc[-1] if loc else '?'}): {reason}".rstrip(": "))
            continue
        parts.append(f"{'.'.join(str(p) for p in loc) or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


async def _on_invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
    content = {"message": f"invalid request: {_field_errors(exc)}", "detail": errors}
    return JSONResponse(status_code=422, content=content)


async def _on_unknown_fn(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, registry.UnknownRewardFn)
    return JSONResponse(status_code=404, content={"message": str(exc), "known": exc.known})


async def _on_fn_failed(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=500, content={"message": str(exc)})


async def _on_verifier_timeout(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, bounded.VerifierTimedOut)
    # 422, like a request the function cannot judge: the same answer would time out again, so no retry
    content = {
        "message": str(exc),
        "error": names.ERR_VERIFIER_TIMEOUT,
        "reward_fn": exc.name,
        "timeout_s": exc.timeout_s,
    }
    return JSONResponse(status_code=422, content=content)


async def _on_model_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=503, content={"message": str(exc)})


async def _on_model_failed(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=502, content={"message": str(exc)})


def _check_rewards(req: ScoreRequest) -> None:
    bad = [i for i, r in enumerate(req.env_rewards) if not math.isfinite(r)]
    if bad:
        loc = ("body", "env_rewards", bad[0])
        raise RequestValidationError([{"type": "finite_number", "loc": loc, "msg": "Input should be a finite number"}])


async def _score_with_model(req: ScoreRequest) -> ScoreResult:
    """Score with a reward model: 503 when it is down, 502 when it answers no score, 422 for the request's faults."""
    _check_rewards(req)
    try:
        return await model_rewards.score(req)
    except registry.RewardInputError as e:
        raise RequestValidationError([{"type": "reward_input", "loc": ("body",), "msg": str(e)}]) from e
    except (RewardModelUnavailable, RewardModelFailed) as e:
        log.warning("%s: %s", req.reward_fn, e)
        raise


def _score(req: ScoreRequest, runner: bounded.BoundedRunner) -> ScoreResult:
    """Score one request; classify everything that can go wrong as 404, 422 (a timeout too) or 500."""
    _check_rewards(req)
    fn, is_bounded = registry.registered(req.reward_fn)  # UnknownRewardFn -> 404
    try:
        result = runner.call(req.reward_fn, fn, req) if is_bounded else fn(req)
    except registry.RewardInputError as e:  # the request lacks what the function needs: 422, like a bad body
        raise RequestValidationError([{"type": "reward_input", "loc": ("body",), "msg": str(e)}]) from e
    except bounded.VerifierTimedOut as e:
        log.warning("%s", e)
        raise
    except bounded.VerifierRaised as e:  # a bug in that reward function, raised in its worker: 500, as in a thread
        log.error("reward function %r failed in its worker:\n%s", req.reward_fn, e.traceback)
        raise RewardFnFailed(f"reward function {req.reward_fn!r} failed: {e}") from e
    except Exception as e:  # a bug in that reward function (or its worker died): 500, logged with its traceback
        log.exception("reward function %r failed", req.reward_fn)
        raise RewardFnFailed(f"reward function {req.reward_fn!r} failed: {type(e).__name__}: {e}") from e
    if not isinstance(result, ScoreResult) or not math.isfinite(result.reward):
        raise RewardFnFailed(f"reward function {req.reward_fn!r} returned an invalid result: {result!r:.200}")
    return result


def create_app(verifier_timeout_s: float | None = None, verifier_processes: int | None = None) -> FastAPI:
    """A fresh app. Holds no state beyond the (import-time) registry of reward functions and its verifier worker
    processes (started on first use, killed at shutdown). None: `$TRAJFLOW_VERIFIER_TIMEOUT_S` (else 5 s) and
    `$TRAJFLOW_VERIFIER_PROCESSES` (else the CPU count)."""
    timeout_s = bounded.timeout_from_env() if verifier_timeout_s is None else verifier_timeout_s
    processes = bounded.processes_from_env() if verifier_processes is None else verifier_processes
    runner = bounded.BoundedRunner(timeout_s, processes, preload=_verifier_modules())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            runner.close()

    app = FastAPI(title="trajflow reward service", version="0.1.0", lifespan=lifespan)
    app.state.verifiers = runner
    app.add_exception_handler(RequestValidationError, _on_invalid_request)
    app.add_exception_handler(registry.UnknownRewardFn, _on_unknown_fn)
    app.add_exception_handler(RewardFnFailed, _on_fn_failed)
    app.add_exception_handler(bounded.VerifierTimedOut, _on_verifier_timeout)
    app.add_exception_handler(RewardModelUnavailable, _on_model_unavailable)
    app.add_exception_handler(RewardModelFailed, _on_model_failed)

    # Rule rewards run from the thread pool, so a CPU-heavy one never blocks the loop (a bounded one waits there for
    # its worker process, at most the time limit); a model's call is awaited.
    @app.post("/score", response_model=ScoreResult)
    async def score(req: ScoreRequest) -> ScoreResult:
        if model_rewards.is_model_reward(req.reward_fn):
            return await _score_with_model(req)
        return await run_in_threadpool(_score, req, runner)

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/reward-fns")
    def reward_fns() -> list[str]:
        return registry.names()

    return app


def _verifier_modules() -> list[str]:
    """What the verifier workers' forkserver imports once: the bounded functions' modules and Math-Verify."""
    modules = {registry.registered(n).fn.__module__ for n in registry.names() if registry.registered(n).bounded}
    return sorted((modules - {"__main__"}) | {"math_verify"})  # a module that is not installed is skipped


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trajflow.rewards.service", description="Run the reward service.")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"), help="default: $HOST or 127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    parser.add_argument("--port", type=int, default=port, help="default: $PORT or 8080")
    parser.add_argument("--workers", type=int, default=1, help="processes serving requests (default 1)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument(
        "--verifier-timeout-s",
        type=lambda raw: bounded.positive_seconds(raw, "--verifier-timeout-s"),
        default=None,
        help=f"time limit of one verifier call, s (default: ${bounded.TIMEOUT_ENV} or {bounded.DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--verifier-processes",
        type=int,
        default=None,
        help=f"verifier worker processes per serving process (default: ${bounded.PROCESSES_ENV} or the CPU count)",
    )
    args = parser.parse_args(argv)
    try:  # the environment's values are checked here too, so a bad one stops the service before it serves
        if args.verifier_timeout_s is None:
            args.verifier_timeout_s = bounded.timeout_from_env()
        if args.verifier_processes is None:
            args.verifier_processes = bounded.processes_from_env()
    except ValueError as e:
        parser.error(str(e))
    if args.verifier_processes < 1:
        parser.error(f"--verifier-processes must be at least 1, got {args.verifier_processes}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Serve the app with uvicorn until SIGINT/SIGTERM (uvicorn shuts down gracefully on either)."""
    import uvicorn

    args = _parse_args(argv)
    # uvicorn builds the app with the factory (in each of its worker processes): it reads the limits from here
    os.environ[bounded.TIMEOUT_ENV] = str(args.verifier_timeout_s)
    os.environ[bounded.PROCESSES_ENV] = str(args.verifier_processes)
    uvicorn.run(
        "trajflow.rewards.service:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
    )


if __name__ == "__main__":
    main()
