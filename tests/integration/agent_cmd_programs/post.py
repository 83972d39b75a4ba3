"""`python3 post.py TEXT`: one chat request of the `agent-cmd:` programs beside it
(tests/integration/test_agent_cmd.py), stdlib only: TEXT as the user's next message of the conversation kept in the
program's cwd (each request extends the previous one, as an agent's does); prints the answer."""

import json
import os
import sys
import urllib.request

past = json.load(open("conversation.json")) if os.path.exists("conversation.json") else []
past.append({"role": "user", "content": sys.argv[1]})
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "policy", "messages": past, "max_tokens": 16}).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
with urllib.request.urlopen(request, timeout=600) as response:
    said = json.load(response)["choices"][0]["message"]["content"]
with open("conversation.json", "w") as f:
    json.dump([*past, {"role": "assistant", "content": said}], f)
print(said.strip())
