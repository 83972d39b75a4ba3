#!/bin/sh
# The Codex CLI, unmodified (npm @openai/codex, installed into the layer from npm-packages.txt, run by Debian's Node):
# `codex exec` on a copy of repo/ against the env's endpoint, speaking the Responses API through a custom provider
# (codex-config.toml.in: no retries, no websockets, no sub-agents, no memories, no analytics, no update check). Its
# exit status is the episode's, but for a turn that failed on an answer cut at max tokens ("Incomplete response"): the
# policy's doing, so the run exits 0 and is scored. The reward comes from the verifier (verify.py: the repository's
# checks).
set -eu
here=$(dirname "$0")
cp -R "$here/repo" repo
export CODEX_HOME="$PWD/.codex" RL_KEY="$OPENAI_API_KEY"
mkdir -p "$CODEX_HOME"
sed "s#@BASE_URL@#$OPENAI_BASE_URL#" "$here/codex-config.toml.in" > "$CODEX_HOME/config.toml"
task=$(python3 -c 'import json, os; t = json.loads(os.environ["TRAJFLOW_AGENT_TASK"]); print(t if isinstance(t, str) else "")')
[ -n "$task" ] || task="restock() in inventory.py returns the wrong total: \`python3 check_inventory.py\` fails. Fix it."
status=0
codex exec --json --ephemeral --skip-git-repo-check -C "$PWD/repo" --dangerously-bypass-approvals-and-sandbox \
    -o "$CODEX_HOME/last-message.txt" "$task" > "$CODEX_HOME/events.jsonl" || status=$?
if [ "$status" != 0 ] && grep -q '"type":"turn.failed".*Incomplete response returned' "$CODEX_HOME/events.jsonl"; then
    exit 0
fi
exit "$status"
