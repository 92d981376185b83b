"""Drives Sublet's Anthropic Messages API with the official `anthropic` client.

Usage: python anthropic_messages.py BASE_URL API_KEY   (BASE_URL without /v1)
Prints one JSON object with what each scenario saw; the Rust test asserts on it.
"""
import json
import sys
import urllib.error
import urllib.request

import anthropic

from shapes import CAPITAL, CITY, WEATHER_CALL

base_url, api_key = sys.argv[1], sys.argv[2]
# This SDK sends no sampling settings (the Messages API it speaks has none): replies are
# greedy, the server's default, so each is the same whole or streamed.
client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
out = {}
question = [{"role": "user", "content": "What is the capital of France?"}]


def text_of(message):
    return "".join(block.text for block in message.content if block.type == "text")


def seen(message):
    return {
        "text": text_of(message),
        "stop_reason": message.stop_reason,
        "stop_sequence": message.stop_sequence,
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
        "id": message.id,
        "type": message.type,
        "role": message.role,
    }


whole = client.messages.create(model="any", max_tokens=16, messages=question)
out["whole"] = seen(whole)

# Streamed through the SDK's own event accumulator.
pieces = []
with client.messages.stream(model="any", max_tokens=16, messages=question) as stream:
    for text in stream.text_stream:
        pieces.append(text)
    final = stream.get_final_message()
out["stream"] = {"pieces": len(pieces), "text": "".join(pieces), "final": seen(final)}

stopped = client.messages.create(
    model="any", max_tokens=16, messages=question, stop_sequences=["Paris"]
)
out["stopped"] = seen(stopped)
short = client.messages.create(model="any", max_tokens=2, messages=question)
out["short"] = seen(short)
# A system prompt in blocks, as Claude Code sends it (the template's default one, which
# SmolLM2's adds when a request gives none, is then left out).
system_blocks = [
    {"type": "text", "text": "You are a geography teacher."},
    {"type": "text", "text": "You answer every question in one short sentence, and you never "
                             "add anything the question did not ask for.", "cache_control": {"type": "ephemeral"}},
]
system = client.messages.create(model="any", max_tokens=16, system=system_blocks, messages=question)
out["system"] = seen(system)

counted = client.messages.count_tokens(model="any", system=system_blocks, messages=question)
out["count_tokens"] = counted.input_tokens

# Structured output: the reply held to a JSON Schema.
shaped = client.messages.create(
    model="any",
    max_tokens=32,
    messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
    output_config={"format": {"type": "json_schema", "schema": CAPITAL}},
)
out["json_schema"] = seen(shaped)

# A tool round trip, the reply held to a call's shape (see shapes.py).
weather = {"name": "get_weather", "description": "The weather in a city now", "input_schema": CITY}
as_call = {"format": {"type": "json_schema", "schema": WEATHER_CALL}}
ask_tool = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.messages.create(
    model="any", max_tokens=48, messages=ask_tool, tools=[weather], output_config=as_call
)
uses = [b for b in first.content if b.type == "tool_use"]
out["tool_first"] = {
    "stop_reason": first.stop_reason,
    "uses": [{"id": u.id, "name": u.name, "input": u.input} for u in uses],
}
with client.messages.stream(
    model="any", max_tokens=48, messages=ask_tool, tools=[weather], output_config=as_call
) as stream:
    streamed = stream.get_final_message()
out["tool_streamed"] = {
    "stop_reason": streamed.stop_reason,
    "uses": [{"id": b.id, "name": b.name, "input": b.input} for b in streamed.content if b.type == "tool_use"],
}
use = uses[0] if uses else None
called = ask_tool + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": use.id if use else "toolu_0",
                                       "name": "get_weather", "input": use.input if use else {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id if use else "toolu_0",
                                  "content": '{"city": "Paris", "sky": "sunny", "celsius": 21}'}]},
]
answered = client.messages.create(
    model="any", max_tokens=32, messages=called, tools=[weather], tool_choice={"type": "none"}
)
out["tool_answered"] = seen(answered)


def refusal(call):
    try:
        call()
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        error = body.get("error") or {}
        return {"status": e.status_code, "shape": body.get("type"), "type": error.get("type"),
                "message": error.get("message")}
    return None


wrong_key = anthropic.Anthropic(base_url=base_url, api_key="not-the-key", max_retries=0)
out["wrong_key"] = refusal(lambda: wrong_key.messages.create(model="any", max_tokens=4, messages=question))
image = [{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    {"type": "text", "text": "What is this?"}]}]
out["image"] = refusal(lambda: client.messages.create(model="any", max_tokens=4, messages=image))
out["thinking"] = refusal(lambda: client.messages.create(
    model="any", max_tokens=2048, messages=question, thinking={"type": "enabled", "budget_tokens": 1024}))
out["server_tool"] = refusal(lambda: client.messages.create(
    model="any", max_tokens=4, messages=question, tools=[{"type": "web_search_20250305", "name": "web_search"}]))
out["too_many_tokens"] = refusal(lambda: client.messages.create(model="any", max_tokens=128000, messages=question))
out["oversized_prompt"] = refusal(lambda: client.messages.create(
    model="any", max_tokens=4, messages=[{"role": "user", "content": "word " * 20000}]))

# max_tokens is required: the SDK will not send a request without it, so this one is raw.
request = urllib.request.Request(
    base_url + "/v1/messages",
    data=json.dumps({"model": "any", "messages": question}).encode(),
    headers={"x-api-key": api_key, "content-type": "application/json", "anthropic-version": "2023-06-01"},
)
try:
    urllib.request.urlopen(request)
    out["no_max_tokens"] = {"status": 200}
except urllib.error.HTTPError as e:
    out["no_max_tokens"] = {"status": e.code, "body": json.loads(e.read())}

after = client.messages.create(model="any", max_tokens=8, messages=question)
out["after_errors"] = text_of(after)
print(json.dumps(out))
