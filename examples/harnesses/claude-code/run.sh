#!/bin/sh
# Claude Code, unmodified (npm @anthropic-ai/claude-code, installed into the layer from npm-packages.txt, run by
# Debian's Node): `claude -p --bare` on a copy of repo/ against the env's endpoint (ANTHROPIC_BASE_URL, the Messages
# API), its tools Bash, Read and Edit. Configuration only: the policy's name for every model alias, its config in the
# work directory, bypass mode allowed as root in a sandbox, no non-essential traffic (updates, telemetry, error
# reports), no attribution header (it would put a random id in the system prompt), no auto-compaction, no sub-agents
# or web tools. A run that ended in a `result` event (success, or out of turns: the policy's doing) exits 0 and the
# verifier (verify.py: the repository's checks) gives the reward; any other ending is Claude Code's exit status.
set -eu
here=$(dirname "$0")
cp -R "$here/repo" repo
export HOME="$PWD/.home" CLAUDE_CONFIG_DIR="$PWD/.claude" IS_SANDBOX=1 \
    ANTHROPIC_MODEL=policy ANTHROPIC_DEFAULT_OPUS_MODEL=policy ANTHROPIC_DEFAULT_SONNET_MODEL=policy \
    ANTHROPIC_DEFAULT_HAIKU_MODEL=policy-aux CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
    CLAUDE_CODE_ATTRIBUTION_HEADER=0 DISABLE_AUTO_COMPACT=1 DISABLE_NON_ESSENTIAL_MODEL_CALLS=1
mkdir -p "$HOME" "$CLAUDE_CONFIG_DIR"
task=$(python3 -c 'import json, os; t = json.loads(os.environ["TRAJFLOW_AGENT_TASK"]); print(t if isinstance(t, str) else "")')
[ -n "$task" ] || task="count_words() in words.py miscounts: \`python3 check_words.py\` fails. Fix it."
cd repo
status=0
claude -p --bare --output-format stream-json --verbose --dangerously-skip-permissions --max-turns 10 \
    --model policy --disallowedTools "Task,Agent,WebFetch,WebSearch" -- "$task" > ../.claude/stream.jsonl || status=$?
grep -q '^{"type":"result"' ../.claude/stream.jsonl && exit 0
exit "$status"
