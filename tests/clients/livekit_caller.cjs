// A caller on LiveKit's official Node SDK (@livekit/rtc-node, LiveKit's own WebRTC).
// Usage: node livekit_caller.cjs URL TOKEN [--publish-tone SECONDS] [--listen SECONDS]
// Joins the room, optionally publishes a 440 Hz tone as its microphone and listens to
// the audio tracks it is sent, reports what it sees as JSON lines on stdout, then leaves.
const {
  AudioFrame, AudioSource, AudioStream, LocalAudioTrack, Room, RoomEvent,
  TrackPublishOptions, TrackSource, dispose,
} = require('@livekit/rtc-node');

const RATE = 48000;

function report(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
}

function option(name) {
  const at = process.argv.indexOf(name);
  return at < 0 ? 0 : Number(process.argv[at + 1]);
}

async function publishTone(room, seconds) {
  const source = new AudioSource(RATE, 1);
  const track = LocalAudioTrack.createAudioTrack('microphone', source);
  const publication = await room.localParticipant.publishTrack(
    track, new TrackPublishOptions({ source: TrackSource.SOURCE_MICROPHONE }));
  report('published', { track_sid: publication.sid });
  const perFrame = RATE / 100;
  for (let i = 0; i < seconds * 100; i++) {
    const samples = new Int16Array(perFrame);
    for (let n = 0; n < perFrame; n++) {
      samples[n] = Math.round(0.3 * 32767 * Math.sin(2 * Math.PI * 440 * (i * perFrame + n) / RATE));
    }
    await source.captureFrame(new AudioFrame(samples, RATE, 1, perFrame));
  }
}

function listen(room) {
  const heard = { frames: 0, sumSquares: 0, samples: 0 };
  room.on(RoomEvent.TrackSubscribed, async (track, publication, participant) => {
    report('subscribed', { identity: participant.identity, track_sid: publication.sid });
    for await (const frame of new AudioStream(track, RATE, 1)) {
      heard.frames += 1;
      for (const s of frame.data) heard.sumSquares += s * s;
      heard.samples += frame.data.length;
    }
  });
  return heard;
}

async function main() {
  const [url, token] = process.argv.slice(2);
  const room = new Room();
  const heard = listen(room);
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
  const waits = [];
  if (tone > 0) waits.push(publishTone(room, tone));
  if (listenFor > 0) waits.push(new Promise((resolve) => setTimeout(resolve, listenFor * 1000)));
  await Promise.all(waits);
  if (listenFor > 0) {
    const rms = heard.samples ? Math.sqrt(heard.sumSquares / heard.samples) : 0;
    report('heard', { frames: heard.frames, rms });
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
