"""Drives Sublet's Responses API with the official `openai` client's `responses`.

Usage: python openai_responses.py BASE_URL API_KEY   (BASE_URL ends in /v1)
Prints one JSON object with what each scenario saw; the Rust test asserts on it.
"""
import json
import sys

import openai

from shapes import CAPITAL, CITY, WEATHER_CALL

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
out = {}
question = "What is the capital of France?"


def seen(response):
    return {
        "id": response.id,
        "object": response.object,
        "status": response.status,
        "text": response.output_text,
        "types": [item.type for item in response.output],
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "incomplete": response.incomplete_details.reason if response.incomplete_details else None,
    }


whole = client.responses.create(model="any", input=question, max_output_tokens=16, temperature=0)
out["whole"] = seen(whole)

# Streamed: the SDK's event stream, then its final response.
deltas, names = [], []
with client.responses.stream(model="any", input=question, max_output_tokens=16, temperature=0) as stream:
    for event in stream:
        names.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = stream.get_final_response()
out["stream"] = {"pieces": len(deltas), "text": "".join(deltas), "events": names, "final": seen(final)}

short = client.responses.create(model="any", input=question, max_output_tokens=2, temperature=0)
out["short"] = seen(short)
# Instructions longer than the template's default system prompt (which SmolLM2's adds
# when a request gives none): their tokens show in the prompt's count.
instructions = (
    "You are a geography teacher. You answer every question in one short sentence, and you "
    "never add anything the question did not ask for."
)
instructed = client.responses.create(
    model="any", instructions=instructions, input=question, max_output_tokens=16, temperature=0
)
out["instructed"] = seen(instructed)

# A conversation continued by id: the kept one's turns count in the next prompt.
first = client.responses.create(model="any", input="My name is Ada.", max_output_tokens=16, temperature=0)
second = client.responses.create(
    model="any", input="What is my name?", previous_response_id=first.id, max_output_tokens=16, temperature=0
)
alone = client.responses.create(model="any", input="What is my name?", max_output_tokens=16, temperature=0)
out["continued"] = {"first": seen(first), "second": seen(second), "alone": seen(alone)}

shaped = client.responses.create(
    model="any",
    input="What is the capital of France? Answer in JSON.",
    max_output_tokens=32,
    temperature=0,
    text={"format": {"type": "json_schema", "name": "capital", "schema": CAPITAL, "strict": True}},
)
out["json_schema"] = seen(shaped)

# A tool round trip, the reply held to a call's shape (see shapes.py).
weather = {"type": "function", "name": "get_weather", "description": "The weather in a city now", "parameters": CITY}
as_call = {"format": {"type": "json_schema", "name": "call", "schema": WEATHER_CALL}}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.responses.create(
    model="any", input=ask, tools=[weather], text=as_call, max_output_tokens=48, temperature=0, store=False
)
calls = [item for item in called.output if item.type == "function_call"]
out["tool_first"] = {
    "status": called.status,
    "calls": [{"call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls],
}
arguments_deltas = []
with client.responses.stream(
    model="any", input=ask, tools=[weather], text=as_call, max_output_tokens=48, temperature=0
) as stream:
    for event in stream:
        if event.type == "response.function_call_arguments.delta":
            arguments_deltas.append(event.delta)
    streamed = stream.get_final_response()
out["tool_streamed"] = {
    "arguments": "".join(arguments_deltas),
    "calls": [{"call_id": c.call_id, "name": c.name} for c in streamed.output if c.type == "function_call"],
}
call = calls[0] if calls else None
answered = client.responses.create(
    model="any",
    input=ask + [
        {"type": "function_call", "call_id": call.call_id if call else "call_0", "name": "get_weather",
         "arguments": call.arguments if call else '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": call.call_id if call else "call_0",
         "output": '{"city": "Paris", "sky": "sunny", "celsius": 21}'},
    ],
    tools=[weather],
    tool_choice="none",
    max_output_tokens=32,
    temperature=0,
)
out["tool_answered"] = seen(answered)


def refusal(call):
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "type": body.get("type"), "param": body.get("param"),
                "code": body.get("code"), "message": body.get("message")}
    return None


wrong_key = openai.OpenAI(base_url=base_url, api_key="not-the-key", max_retries=0)
out["wrong_key"] = refusal(lambda: wrong_key.responses.create(model="any", input=question))
out["image"] = refusal(lambda: client.responses.create(model="any", input=[{"role": "user", "content": [
    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]))
out["hosted_tool"] = refusal(lambda: client.responses.create(
    model="any", input=question, tools=[{"type": "web_search"}]))
out["unknown_previous"] = refusal(lambda: client.responses.create(
    model="any", input=question, previous_response_id="resp_unknown"))
out["not_kept"] = refusal(lambda: client.responses.create(
    model="any", input=question, previous_response_id=called.id))
out["too_many_tokens"] = refusal(lambda: client.responses.create(model="any", input=question, max_output_tokens=10**7))
out["oversized_prompt"] = refusal(lambda: client.responses.create(model="any", input="word " * 20000))

after = client.responses.create(model="any", input=question, max_output_tokens=8, temperature=0)
out["after_errors"] = after.output_text
print(json.dumps(out))
