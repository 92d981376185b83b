# An agent worker on LiveKit's official Agents framework (PyPI livekit-agents), used to
# check the test server's worker side: registration, job offers, assignments and the
# tokens they carry.
# Usage: python livekit_worker.py URL API_KEY API_SECRET AGENT_NAME
# Registers, takes one job: joins its room, sets the attribute lk.agent.state, leaves; then
# drains and exits. Reports JSON lines on stdout: registered, job, done (or error).
import asyncio
import json
import sys
import threading

from livekit.agents import AgentServer, JobContext, JobExecutorType


def report(event, **fields):
    print(json.dumps({"event": event, **fields}), flush=True)


async def main():
    url, key, secret, agent_name = sys.argv[1:5]
    server = AgentServer(
        ws_url=url,
        api_key=key,
        api_secret=secret,
        job_executor_type=JobExecutorType.THREAD,
        num_idle_processes=0,
        port=0,
    )
    finished = threading.Event()

    @server.rtc_session(agent_name=agent_name)
    async def entrypoint(ctx: JobContext):
        await ctx.connect()
        await ctx.room.local_participant.set_attributes({"lk.agent.state": "listening"})
        report(
            "job",
            job_id=ctx.job.id,
            room=ctx.room.name,
            identity=ctx.room.local_participant.identity,
        )
        await asyncio.sleep(2)
        finished.set()
        ctx.shutdown(reason="the check is done")

    server.on(
        "worker_registered",
        lambda worker_id, _info: report("registered", worker_id=worker_id),
    )
    running = asyncio.create_task(server.run(devmode=True))
    done = await asyncio.to_thread(finished.wait, 60)
    await asyncio.sleep(1)
    await server.drain(timeout=10)
    await server.aclose()
    running.cancel()
    report("done", job_finished=done)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:  # reported, for the test to show
        report("error", message=repr(e))
        sys.exit(1)
