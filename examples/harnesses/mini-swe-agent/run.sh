#!/bin/sh
# mini-swe-agent, unmodified, on a copy of repo/ (an `agent-cmd:run.sh` task): `mini` runs against the env's endpoint
# (OPENAI_BASE_URL) with its own default config (mini.yaml: one `bash` tool), yolo mode, exiting when the agent
# submits; its exit status is the episode's. The reward comes from the verifier (verify.py: the repository's tests).
# Configuration only: no first-run wizard, no cost tracking (an unknown model has no price), litellm's price map from
# the package (it would fetch one from GitHub), one attempt per model call (a retry would be a second turn), its
# global config and trajectory file in the work directory.
set -eu
here=$(dirname "$0")
cp -R "$here/repo" repo
export MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors LITELLM_LOCAL_MODEL_COST_MAP=True \
    MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1 MSWEA_GLOBAL_CONFIG_DIR="$PWD/.mini"
task=$(python3 -c 'import json, os; t = json.loads(os.environ["TRAJFLOW_AGENT_TASK"]); print(t if isinstance(t, str) else "")')
[ -n "$task" ] || task="Running \`python3 test_calc.py\` fails: average() returns the wrong value. Fix calc.py."
exec python3 -m minisweagent -y --exit-immediately -m openai/policy -t "$task" \
    -c mini.yaml -c agent.step_limit=8 -c agent.cost_limit=0 -c "environment.cwd=$PWD/repo" \
    -c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -c "model.model_kwargs.api_key=$OPENAI_API_KEY" \
    -o "$PWD/.mini/trajectory.json"
