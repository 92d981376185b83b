"""Drives Sublet's OpenAI-compatible API with the official `openai` client.

Usage: python openai_chat.py BASE_URL API_KEY
Prints one JSON object with what each scenario saw; the Rust test asserts on it. The server
is expected to take at most two requests in flight (`--api-max-in-flight 2`).
"""
import json
import sys
import time

import urllib.error
import urllib.request

import openai

from shapes import CAPITAL, CITY, WEATHER_CALL

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

stopped = client.chat.completions.create(model="any", messages=question, max_tokens=16, stop=["Paris"])
out["stopped"] = {
    "content": stopped.choices[0].message.content,
    "finish_reason": stopped.choices[0].finish_reason,
}

# Structured output: the reply held to a JSON Schema, and JSON mode (any object).
ask_json = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
for case, response_format in [
    ("json_schema", {"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL}}),
    ("json_object", {"type": "json_object"}),
]:
    shaped = client.chat.completions.create(model="any", messages=ask_json, max_tokens=32, response_format=response_format)
    out[case] = {"content": shaped.choices[0].message.content, "finish_reason": shaped.choices[0].finish_reason}

pieces, finish, usage = [], None, None
stream = client.chat.completions.create(
    model="any",
    messages=question,
    max_tokens=16,
    stream=True,
    stream_options={"include_usage": True},
    # Asking to outrank the callers: the server runs it at agent priority.
    extra_body={"priority": -1},
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
        return {
            "status": e.status_code,
            "type": body.get("type"),
            "param": body.get("param"),
            "code": body.get("code"),
            "message": body.get("message"),
        }
    return None


wrong_key = openai.OpenAI(base_url=base_url, api_key="not-the-key", max_retries=0)
out["wrong_key"] = refusal(lambda: wrong_key.chat.completions.create(model="any", messages=question, max_tokens=4))
out["bad_role"] = refusal(
    lambda: client.chat.completions.create(model="any", messages=[{"role": "robot", "content": "hi"}], max_tokens=4)
)
out["unknown_format"] = refusal(
    lambda: client.chat.completions.create(model="any", messages=question, max_tokens=4, response_format={"type": "yaml"})
)
# A schema llguidance cannot compile is refused by the server, naming the field, before
# the engine's thread compiles anything.
misspelt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}
out["uncompilable_schema"] = refusal(
    lambda: client.chat.completions.create(model="any", messages=question, max_tokens=4, response_format=misspelt)
)
out["too_many_tokens"] = refusal(lambda: client.chat.completions.create(model="any", messages=question, max_tokens=10**7))
long_prompt = [{"role": "user", "content": "word " * 20000}]
out["oversized_prompt"] = refusal(lambda: client.chat.completions.create(model="any", messages=long_prompt, max_tokens=4))
# Near the 4 MiB body bound: refused from its length in bytes, never tokenized.
huge_prompt = [{"role": "user", "content": "x" * 4_000_000}]
out["huge_prompt"] = refusal(lambda: client.chat.completions.create(model="any", messages=huge_prompt, max_tokens=4))

def raw_post(data, content_type):
    """Posts bytes the official client would never send; the status and error body."""
    request = urllib.request.Request(
        base_url + "/chat/completions",
        data=data,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": content_type},
    )
    try:
        urllib.request.urlopen(request)
        return {"status": 200}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": json.loads(e.read())}


out["malformed_json"] = raw_post(b'{"messages": [ {"role": "user", "content": ', "application/json")
# A web page's form post to a keyless local server is refused, not parsed.
out["form_post"] = raw_post(b"messages=hello", "application/x-www-form-urlencoded")

# A coding agent's tool loop. The bundled small model does not call tools on its own, so
# a JSON Schema holds its reply to a call's shape, which mistral.rs reads as a call; the
# call is answered by a tool message, and the reply after it comes whole and streamed.
weather_tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": CITY,
    },
}
as_call = {"type": "json_schema", "json_schema": {"name": "call", "schema": WEATHER_CALL}}
ask_tool = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.chat.completions.create(
    model="any", messages=ask_tool, tools=[weather_tool], max_tokens=48, response_format=as_call
)
calls = first.choices[0].message.tool_calls or []
out["tool_first"] = {
    "finish_reason": first.choices[0].finish_reason,
    "content": first.choices[0].message.content,
    "calls": [{"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments} for c in calls],
}
streamed_calls, finish = [], None
for chunk in client.chat.completions.create(
    model="any", messages=ask_tool, tools=[weather_tool], max_tokens=48, response_format=as_call, stream=True
):
    for choice in chunk.choices:
        for c in choice.delta.tool_calls or []:
            streamed_calls.append({"index": c.index, "id": c.id, "name": c.function.name, "arguments": c.function.arguments})
        if choice.finish_reason:
            finish = choice.finish_reason
out["tool_streamed"] = {"calls": streamed_calls, "finish_reason": finish}
call_id = calls[0].id if calls else "call_0"
arguments = calls[0].function.arguments if calls else '{"city": "Paris"}'
called = ask_tool + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
    {"role": "tool", "tool_call_id": call_id, "content": '{"city": "Paris", "sky": "sunny", "celsius": 21}'},
]
answered = client.chat.completions.create(
    model="any", messages=called, tools=[weather_tool], tool_choice="none", max_tokens=32
)
out["tool_answered"] = {
    "content": answered.choices[0].message.content,
    "finish_reason": answered.choices[0].finish_reason,
    "prompt_tokens": answered.usage.prompt_tokens,
}
out["tool_required"] = refusal(
    lambda: client.chat.completions.create(
        model="any", messages=ask_tool, tools=[weather_tool], tool_choice="required", max_tokens=4
    )
)
out["tool_result_without_id"] = refusal(
    lambda: client.chat.completions.create(
        model="any", messages=ask_tool + [{"role": "tool", "content": "sunny"}], max_tokens=4
    )
)

# A text continued as it stands (the legacy completions API), whole and streamed.
text_prompt = "The capital of France is"
text_whole = client.completions.create(model="any", prompt=text_prompt, max_tokens=8)
out["text_whole"] = {
    "object": text_whole.object,
    "text": text_whole.choices[0].text,
    "finish_reason": text_whole.choices[0].finish_reason,
    "prompt_tokens": text_whole.usage.prompt_tokens,
    "completion_tokens": text_whole.usage.completion_tokens,
}
text_pieces, finish, usage = [], None, None
for chunk in client.completions.create(
    model="any", prompt=text_prompt, max_tokens=8, stream=True, stream_options={"include_usage": True}
):
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for choice in chunk.choices:
        text_pieces.append(choice.text)
        if choice.finish_reason:
            finish = choice.finish_reason
out["text_stream"] = {"text": "".join(text_pieces), "pieces": len(text_pieces), "finish_reason": finish, "completion_tokens": usage}
out["text_echo"] = refusal(lambda: client.completions.create(model="any", prompt=text_prompt, max_tokens=4, echo=True))
out["text_oversized"] = refusal(lambda: client.completions.create(model="any", prompt="word " * 20000, max_tokens=4))

# Sampled replies: the same seed gives the same reply, other seeds others.
poem = [{"role": "user", "content": "Write a short poem about the sea."}]
def sampled(seed):
    reply = client.chat.completions.create(model="any", messages=poem, max_tokens=24, temperature=1.0, seed=seed)
    return reply.choices[0].message.content
out["seeded"] = {"first": sampled(7), "again": sampled(7), "others": [sampled(8), sampled(9)]}

after = client.chat.completions.create(model="any", messages=question, max_tokens=8)
out["after_errors"] = after.choices[0].message.content

# Two long replies in flight (each returns once its first token is out), then a third.
story = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]
held = [
    client.chat.completions.create(model="any", messages=story, max_tokens=400, stream=True)
    for _ in range(2)
]
try:
    client.chat.completions.create(model="any", messages=question, max_tokens=4)
    out["busy"] = {"status": 200}
except openai.APIStatusError as e:
    out["busy"] = {"status": e.status_code, "retry_after": e.response.headers.get("retry-after")}
for stream in held:
    stream.close()
# The closed streams free their places once the server sees their clients gone; a client
# that honours Retry-After is then served.
for attempt in range(20):
    try:
        again = client.chat.completions.create(model="any", messages=question, max_tokens=8)
        out["after_busy"] = {"content": again.choices[0].message.content, "attempts": attempt + 1}
        break
    except openai.RateLimitError:
        time.sleep(0.5)

# /metrics is behind the key too.
metrics_url = base_url.removesuffix("/v1") + "/metrics"
try:
    urllib.request.urlopen(metrics_url)
    out["metrics_without_key"] = 200
except urllib.error.HTTPError as e:
    out["metrics_without_key"] = e.code

# The metrics once nothing is in flight (the closed streams counted as cancelled).
for _ in range(40):
    keyed = urllib.request.Request(metrics_url, headers={"Authorization": f"Bearer {api_key}"})
    metrics = urllib.request.urlopen(keyed).read().decode()
    in_flight = [line for line in metrics.splitlines() if line.startswith("sublet_requests_in_flight{")]
    if in_flight and all(line.endswith(" 0") for line in in_flight):
        break
    time.sleep(0.25)
out["metrics"] = metrics
print(json.dumps(out))
