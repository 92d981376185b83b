// A caller on LiveKit's official Node SDK (@livekit/rtc-node, LiveKit's own WebRTC).
// Usage: node livekit_caller.cjs URL TOKEN [--publish-tone SECONDS] [--publish-wav PATH]
//                                          [--publish-video SECONDS]
//                                          [--listen SECONDS] [--record PATH]
// Joins the room, optionally publishes a 440 Hz tone or a 16-bit mono WAV file (in real
// time) as its microphone, optionally a camera (VP8, a moving grey picture) before it,
// and listens to the audio tracks it is sent (recording the
// first to a 48 kHz WAV file with --record), reports what it sees as JSON lines on
// stdout, then leaves. While a WAV file plays, each start of loud audio heard after
// 300 ms of quiet is reported as an `onset` at the WAV's time (`at_s`): the caller's
// side of voice to voice for each of the file's turns.
const {
  AudioFrame, AudioSource, AudioStream, LocalAudioTrack, LocalVideoTrack, Room, RoomEvent,
  TrackPublishOptions, TrackSource, VideoBufferType, VideoCodec, VideoFrame, VideoSource,
  dispose,
} = require('@livekit/rtc-node');

const fs = require('fs');

const RATE = 48000;

function report(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
}

function text(name) {
  const at = process.argv.indexOf(name);
  return at < 0 ? null : process.argv[at + 1];
}

function option(name) {
  const at = process.argv.indexOf(name);
  return at < 0 ? 0 : Number(process.argv[at + 1]);
}

async function publishMicrophone(room, rate) {
  const source = new AudioSource(rate, 1);
  const track = LocalAudioTrack.createAudioTrack('microphone', source);
  const publication = await room.localParticipant.publishTrack(
    track, new TrackPublishOptions({ source: TrackSource.SOURCE_MICROPHONE }));
  report('published', { track_sid: publication.sid });
  return source;
}

// Publishes a camera track and sends 10 frames a second into it for `seconds`.
async function publishVideo(room, seconds) {
  const [width, height] = [160, 120];
  const source = new VideoSource(width, height);
  const track = LocalVideoTrack.createVideoTrack('camera', source);
  const publication = await room.localParticipant.publishTrack(track, new TrackPublishOptions({
    source: TrackSource.SOURCE_CAMERA, simulcast: false, videoCodec: VideoCodec.VP8,
  }));
  report('published_video', { track_sid: publication.sid });
  const frame = new Uint8Array(width * height * 4);
  for (let n = 0; n < seconds * 10; n++) {
    frame.fill((n * 16) % 256);
    source.captureFrame(new VideoFrame(frame, width, height, VideoBufferType.RGBA));
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// Sends `samples` (Int16Array at `rate`) in 10 ms frames, paced by the source.
async function speak(source, samples, rate) {
  const perFrame = rate / 100;
  for (let at = 0; at + perFrame <= samples.length; at += perFrame) {
    await source.captureFrame(new AudioFrame(samples.slice(at, at + perFrame), rate, 1, perFrame));
  }
}

async function publishTone(room, seconds) {
  const source = await publishMicrophone(room, RATE);
  const samples = new Int16Array(RATE * seconds);
  for (let n = 0; n < samples.length; n++) {
    samples[n] = Math.round(0.3 * 32767 * Math.sin(2 * Math.PI * 440 * n / RATE));
  }
  await speak(source, samples, RATE);
}

// A PCM WAV file's 16-bit mono samples and rate.
function readWav(path) {
  const bytes = fs.readFileSync(path);
  let at = 12, rate = 0, channels = 0, bits = 0;
  while (at + 8 <= bytes.length) {
    const id = bytes.toString('ascii', at, at + 4);
    const size = bytes.readUInt32LE(at + 4);
    if (id === 'fmt ') {
      channels = bytes.readUInt16LE(at + 10);
      rate = bytes.readUInt32LE(at + 12);
      bits = bytes.readUInt16LE(at + 22);
    } else if (id === 'data') {
      if (channels !== 1 || bits !== 16) throw new Error(`${path}: need 16-bit mono PCM`);
      const data = bytes.subarray(at + 8, at + 8 + size);
      const samples = new Int16Array(data.length / 2);
      for (let i = 0; i < samples.length; i++) samples[i] = data.readInt16LE(i * 2);
      return { samples, rate };
    }
    at += 8 + size + (size % 2);
  }
  throw new Error(`${path}: no data chunk`);
}

// Speaks the file, then goes on sending silence (an open microphone) until `untilMs`, or
// for a second.
async function publishWav(room, path, untilMs, heard) {
  const { samples, rate } = readWav(path);
  const source = await publishMicrophone(room, rate);
  heard.startedAt = Date.now();
  // The caller's last audio: the end of the last frame with speech in it.
  let end = samples.length;
  while (end > 0 && Math.abs(samples[end - 1]) < 300) end--;
  const perFrame = rate / 100;
  end = Math.min(samples.length, Math.ceil(end / perFrame) * perFrame);
  await speak(source, samples.subarray(0, end), rate);
  heard.spokeAt = Date.now();
  await speak(source, samples.subarray(end), rate);
  report('spoke', { seconds: samples.length / rate, speech_seconds: end / rate });
  const until = Math.max(untilMs, Date.now() + 1000);
  const silence = new Int16Array(rate / 10);
  while (Date.now() < until) await speak(source, silence, rate);
}

function listen(room) {
  const heard = {
    frames: 0, sumSquares: 0, samples: 0, recording: null, spokeAt: 0, replyAt: 0,
    startedAt: 0, quietS: 0,
  };
  room.on(RoomEvent.TrackSubscribed, async (track, publication, participant) => {
    report('subscribed', { identity: participant.identity, track_sid: publication.sid });
    const recording = heard.recording ? null : (heard.recording = []);
    for await (const frame of new AudioStream(track, RATE, 1)) {
      heard.frames += 1;
      for (const s of frame.data) heard.sumSquares += s * s;
      heard.samples += frame.data.length;
      if (recording) recording.push(Int16Array.from(frame.data));
      let sum = 0;
      for (const s of frame.data) sum += s * s;
      const loud = Math.sqrt(sum / frame.data.length) > 500;
      // Voice to voice: the caller's last audio sent → the first loud audio heard after it.
      if (heard.spokeAt && !heard.replyAt && loud) heard.replyAt = Date.now();
      if (loud && heard.startedAt && heard.quietS >= 0.3) {
        report('onset', { at_s: (Date.now() - heard.startedAt) / 1000 });
      }
      heard.quietS = loud ? 0 : heard.quietS + frame.data.length / RATE;
    }
  });
  return heard;
}

function writeWav(path, chunks, rate) {
  const length = chunks.reduce((n, c) => n + c.length, 0);
  const bytes = Buffer.alloc(44 + length * 2);
  bytes.write('RIFF', 0, 'ascii');
  bytes.writeUInt32LE(36 + length * 2, 4);
  bytes.write('WAVEfmt ', 8, 'ascii');
  bytes.writeUInt32LE(16, 16);
  bytes.writeUInt16LE(1, 20);
  bytes.writeUInt16LE(1, 22);
  bytes.writeUInt32LE(rate, 24);
  bytes.writeUInt32LE(rate * 2, 28);
  bytes.writeUInt16LE(2, 32);
  bytes.writeUInt16LE(16, 34);
  bytes.write('data', 36, 'ascii');
  bytes.writeUInt32LE(length * 2, 40);
  let at = 44;
  for (const chunk of chunks) for (const s of chunk) { bytes.writeInt16LE(s, at); at += 2; }
  fs.writeFileSync(path, bytes);
}

async function main() {
  const [url, token] = process.argv.slice(2);
  const room = new Room();
  const heard = listen(room);
  room.registerTextStreamHandler('lk.transcription', async (reader, { identity }) => {
    const text = await reader.readAll();
    report('transcription', { identity, text, attributes: reader.info.attributes });
  });
  room.on(RoomEvent.Reconnecting, () => report('reconnecting'));
  room.on(RoomEvent.Reconnected, () => report('reconnected'));
  room.on(RoomEvent.Disconnected, (reason) => report('room_disconnected', { reason }));
  room.on(RoomEvent.ParticipantDisconnected, (participant) => {
    report('participant_left', { identity: participant.identity });
  });
  room.on(RoomEvent.ParticipantAttributesChanged, (changed, participant) => {
    report('attributes', { identity: participant.identity, changed });
  });
  try {
    await room.connect(url, token, { autoSubscribe: true, dynacast: false });
  } catch (e) {
    report('error', { message: String(e && e.message ? e.message : e) });
    await dispose();
    process.exit(1);
  }
  report('connected', {
    identity: room.localParticipant.identity,
    participant_sid: room.localParticipant.sid,
    room: room.name,
    room_sid: await room.getSid(),
  });
  const listenFor = option('--listen');
  const tone = option('--publish-tone');
  const wav = text('--publish-wav');
  const video = option('--publish-video');
  const waits = [];
  if (video > 0) {
    const sending = publishVideo(room, video);
    // The camera first, so that the agent sees it before any microphone.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    waits.push(sending);
  }
  if (tone > 0) waits.push(publishTone(room, tone));
  if (wav) waits.push(publishWav(room, wav, Date.now() + listenFor * 1000, heard));
  if (listenFor > 0) waits.push(new Promise((resolve) => setTimeout(resolve, listenFor * 1000)));
  await Promise.all(waits);
  if (listenFor > 0) {
    const rms = heard.samples ? Math.sqrt(heard.sumSquares / heard.samples) : 0;
    const voiceToVoice = heard.replyAt ? heard.replyAt - heard.spokeAt : null;
    report('heard', { frames: heard.frames, rms, voice_to_voice_ms: voiceToVoice });
    const record = text('--record');
    if (record && heard.recording) writeWav(record, heard.recording, RATE);
  }
  await room.disconnect();
  report('disconnected');
  await dispose();
  process.exit(0);
}

main().catch(async (e) => {
  report('error', { message: String(e && e.stack ? e.stack : e) });
  process.exit(1);
});
