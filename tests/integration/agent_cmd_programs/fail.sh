#!/bin/sh
# One call, then a failure: exit status 3 with a word on stderr.
python3 "$(dirname "$0")/post.py" first > /dev/null
echo "the agent broke here" >&2
exit 3
