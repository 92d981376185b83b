"""Drives Sublet's OpenAI-compatible API with the official `openai` client.

Usage: python openai_chat.py BASE_URL API_KEY
Prints one JSON object with what each scenario saw; the Rust test asserts on it.
"""
import json
import sys

import urllib.error
import urllib.request

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
out = {}

out["models"] = [m.id for m in client.models.list().data]

question = [{"role": "user", "content": "What is the capital of France?"}]
whole = client.chat.completions.create(model="any", messages=question, max_tokens=16)
out["whole"] = {
    "content": whole.choices[0].message.content,
    "finish_reason": whole.choices[0].finish_reason,
    "completion_tokens": whole.usage.completion_tokens,
    "prompt_tokens": whole.usage.prompt_tokens,
}

pieces, finish, usage = [], None, None
stream = client.chat.completions.create(
    model="any",
    messages=question,
    max_tokens=16,
    stream=True,
    stream_options={"include_usage": True},
    extra_body={"priority": 0},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
out["stream"] = {"pieces": len(pieces), "content": "".join(pieces), "finish_reason": finish, "completion_tokens": usage}


def refusal(call):
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "type": body.get("type"), "param": body.get("param"), "message": body.get("message")}
    return None


wrong_key = openai.OpenAI(base_url=base_url, api_key="not-the-key", max_retries=0)
out["wrong_key"] = refusal(lambda: wrong_key.chat.completions.create(model="any", messages=question, max_tokens=4))
out["bad_role"] = refusal(
    lambda: client.chat.completions.create(model="any", messages=[{"role": "robot", "content": "hi"}], max_tokens=4)
)
out["too_many_tokens"] = refusal(lambda: client.chat.completions.create(model="any", messages=question, max_tokens=10**7))
long_prompt = [{"role": "user", "content": "word " * 20000}]
out["oversized_prompt"] = refusal(lambda: client.chat.completions.create(model="any", messages=long_prompt, max_tokens=4))

raw = urllib.request.Request(
    base_url + "/chat/completions",
    data=b'{"messages": [ {"role": "user", "content": ',
    headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
)
try:
    urllib.request.urlopen(raw)
    out["malformed_json"] = {"status": 200}
except urllib.error.HTTPError as e:
    out["malformed_json"] = {"status": e.code, "body": json.loads(e.read())}

after = client.chat.completions.create(model="any", messages=question, max_tokens=8)
out["after_errors"] = after.choices[0].message.content

metrics = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics").read().decode()
out["metrics"] = metrics
print(json.dumps(out))
