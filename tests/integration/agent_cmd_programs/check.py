"""edit.sh's verifier: run after it, in its work directory (`trajflow/envs/agent_verify.py`)."""

import os


def verify(task, seed, result):
    with open(os.path.join("repo", "answer.txt")) as f:
        answer = f.read().strip()
    return {"reward": 1.0 if answer == "fixed" else 0.0, "info": {"answer": answer, "status": result["exit_status"]}}
