// A caller on LiveKit's official Node SDK (@livekit/rtc-node, LiveKit's own WebRTC).
// Usage: node livekit_caller.cjs URL TOKEN
// Joins the room, reports what it sees as JSON lines on stdout, then leaves.
const { Room, dispose } = require('@livekit/rtc-node');

function report(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
}

async function main() {
  const [url, token] = process.argv.slice(2);
  const room = new Room();
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
  await room.disconnect();
  report('disconnected');
  await dispose();
}

main().catch(async (e) => {
  report('error', { message: String(e && e.stack ? e.stack : e) });
  process.exit(1);
});
