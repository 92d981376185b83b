// The live page: joins the call's LiveKit room as the caller (LiveKit's browser SDK),
// publishes the microphone, plays the agent, and shows what the room carries (the agent's
// state, transcripts, each turn's record on `sublet.turn`) beside the engine's state,
// polled from `/engine`. `?autostart` calls at once (the browser test does); `?debug`
// turns on the SDK's debug log.
"use strict";

const LK = window.LivekitClient;
const $ = (id) => document.getElementById(id);
const STAGE_SCALE_S = 4; // a full bar's width, in seconds
const AGENT_STATE = "lk.agent.state";

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function setStatus(text) {
  $("status").textContent = text;
}

function showAgentState(state) {
  const e = $("agent-state");
  e.textContent = state;
  e.className = "state " + state;
}

function showTranscript(fromCaller, isFinal, text) {
  if (fromCaller && !isFinal) {
    $("partial").textContent = text;
    return;
  }
  if (fromCaller) $("partial").textContent = "";
  if (!text) return;
  $("transcript").appendChild(element("p", fromCaller ? "caller" : "agent", text));
}

function showTurn(message) {
  const turn = element("div", "turn");
  const head = element("div", "head");
  const record = message.record;
  const v2v = message.voice_to_voice_s;
  head.appendChild(element("span", "", `Turn ${record.index}: “${record.transcript}”`));
  head.appendChild(element("strong", "v2v", `voice to voice ${v2v.toFixed(2)} s`));
  turn.appendChild(head);
  const bar = element("div", "bar");
  message.stages.forEach((stage, i) => {
    const span = element("span", "s" + i);
    span.style.width = `${(100 * Math.max(stage.s, 0)) / STAGE_SCALE_S}%`;
    span.title = `${stage.stage}: ${stage.s.toFixed(2)} s`;
    bar.appendChild(span);
  });
  turn.appendChild(bar);
  const figures = message.stages
    .map((stage) => `${stage.stage} ${stage.s.toFixed(2)} s`)
    .join(" · ");
  turn.appendChild(element("div", "stages", figures));
  if (record.outcome && record.outcome !== "answered") {
    turn.appendChild(element("div", "outcome", `outcome: ${record.outcome}`));
  }
  $("turns").appendChild(turn);
  if (!$("legend").childElementCount) {
    message.stages.forEach((stage, i) => {
      const item = element("span");
      item.appendChild(element("i", "s" + i));
      item.appendChild(document.createTextNode(stage.stage));
      $("legend").appendChild(item);
    });
  }
}

function row(table, label, value) {
  const tr = element("tr");
  tr.appendChild(element("td", "", label));
  tr.appendChild(element("td", "", value));
  table.appendChild(tr);
}

const MB = 1024 * 1024;

function showEngine(state) {
  const root = $("engine");
  root.replaceChildren();
  const kv = state.kv;
  const share = kv.budget_tokens ? kv.used_tokens / kv.budget_tokens : 0;
  root.appendChild(
    element(
      "div",
      "kv",
      state.make_room
        ? `KV ${kv.used_tokens} of ${kv.budget_tokens} tokens (${(100 * share).toFixed(0)}%)`
        : "KV: make-room is off (mistral.rs's own scheduler keeps no figures)",
    ),
  );
  const kvbar = element("div", "kvbar");
  const fill = element("span");
  fill.style.width = `${Math.min(100, 100 * share)}%`;
  kvbar.appendChild(fill);
  root.appendChild(kvbar);
  const table = element("table");
  const requests = (list) =>
    list.length ? list.map((p) => `${p.requests} at ${p.priority}`).join(", ") : "none";
  row(table, "model", state.model);
  if (state.speech_models) {
    row(table, "speech to text", state.speech_models.stt);
    row(table, "voice", state.speech_models.voice);
  }
  row(table, "make-room", state.make_room ? "on" : "off");
  row(table, "running (by priority)", requests(state.running));
  row(table, "waiting (by priority)", requests(state.waiting));
  for (const [name, value] of Object.entries(state.counters)) {
    row(table, name.replaceAll("_", " "), String(value));
  }
  const memory = state.memory || {};
  for (const [name, value] of Object.entries(memory)) {
    const label = name.replace(/_bytes$/, "").replaceAll("_", " ");
    if (typeof value === "number") row(table, label, `${(value / MB).toFixed(0)} MB`);
  }
  for (const part of memory.large_blocks || []) {
    const mb = (bytes) => (bytes / MB).toFixed(0);
    row(
      table,
      `${part.part.replaceAll("_", " ")} large blocks`,
      `${mb(part.resident_bytes)} of ${mb(part.allocated_bytes)} MB resident`,
    );
  }
  root.appendChild(table);
}

async function pollEngine() {
  try {
    const response = await fetch("/engine");
    if (response.ok) showEngine(await response.json());
  } catch (e) {
    $("engine").textContent = `engine: ${e}`;
  }
}

async function call() {
  $("call").disabled = true;
  const response = await fetch("/session");
  if (!response.ok) {
    setStatus(await response.text());
    $("call").disabled = false;
    return;
  }
  const session = await response.json();
  // Two peer connections, as LiveKit's other clients use.
  const room = new LK.Room({ singlePeerConnection: false });
  room.registerTextStreamHandler("lk.transcription", async (reader, participant) => {
    const text = await reader.readAll();
    const attributes = reader.info.attributes || {};
    const isFinal = attributes["lk.transcription_final"] !== "false";
    showTranscript(participant.identity === session.identity, isFinal, text);
  });
  room.registerTextStreamHandler("sublet.turn", async (reader) => {
    showTurn(JSON.parse(await reader.readAll()));
  });
  room.on(LK.RoomEvent.TrackSubscribed, (track) => {
    if (track.kind === "audio") document.body.appendChild(track.attach());
  });
  room.on(LK.RoomEvent.ParticipantConnected, (participant) => {
    if (participant.attributes[AGENT_STATE]) showAgentState(participant.attributes[AGENT_STATE]);
  });
  room.on(LK.RoomEvent.ParticipantAttributesChanged, (changed) => {
    if (changed[AGENT_STATE]) showAgentState(changed[AGENT_STATE]);
  });
  room.on(LK.RoomEvent.Disconnected, () => {
    setStatus("disconnected");
    $("call").disabled = false;
  });
  setStatus(`joining ${session.room}…`);
  await room.connect(session.url, session.token);
  for (const participant of room.remoteParticipants.values()) {
    if (participant.attributes[AGENT_STATE]) showAgentState(participant.attributes[AGENT_STATE]);
  }
  await room.localParticipant.setMicrophoneEnabled(true);
  setStatus(`in ${session.room} as ${session.identity}`);
  window.subletRoom = room;
}

const params = new URLSearchParams(location.search);
if (params.has("debug")) LK.setLogLevel("debug");
function failed(e) {
  setStatus(`failed: ${e}`);
  $("call").disabled = false;
}

$("call").addEventListener("click", () => call().catch(failed));
pollEngine();
setInterval(pollEngine, 1000);
if (params.has("autostart")) {
  call().catch(failed);
}
