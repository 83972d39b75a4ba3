#!/bin/sh
# Two calls, the second extending the first; reward 1 (in the reward file) when the second answer is "yes".
here=$(dirname "$0")
python3 "$here/post.py" "question $TRAJFLOW_AGENT_SEED: $TRAJFLOW_AGENT_TASK $*" > /dev/null || exit 3
second=$(python3 "$here/post.py" "sure?") || exit 4
[ "$second" = yes ] && reward=1 || reward=0
echo "{\"reward\": $reward, \"info\": {\"calls\": 2}}" > "$TRAJFLOW_AGENT_REWARD_FILE"
