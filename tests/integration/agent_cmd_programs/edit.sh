#!/bin/sh
# One call; the answer goes into a file of a repository in its work directory, and it exits 0 without a reward file:
# its verifier (check.py, env_kwargs.verifier = "check:verify") reads that file and gives the reward.
here=$(dirname "$0")
mkdir repo || exit 5
python3 "$here/post.py" "fix the repository" > repo/answer.txt || exit 3
