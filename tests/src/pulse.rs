//! A private PulseAudio server for the microphone tests: a real sound server that the
//! microphone demo reaches through ALSA (cpal), with two null sinks standing in for the
//! hardware. What is played into `caller_mouth` is what the default microphone hears (its
//! monitor is the default source); the default output is `agent_speaker`, whose monitor
//! records what the agent said.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running server; dropping it stops it.
pub struct PulseAudio {
    runtime_dir: PathBuf,
}

impl PulseAudio {
    pub fn start() -> Result<Self> {
        let runtime_dir = std::env::temp_dir().join(format!("sublet-pulse-{}", std::process::id()));
        std::fs::create_dir_all(&runtime_dir)?;
        let server = Self { runtime_dir };
        let status = server
            .command("pulseaudio")
            .args([
                "--daemonize=yes",
                "--exit-idle-time=-1",
                "-n",
                "--load=module-native-protocol-unix",
                "--load=module-null-sink sink_name=agent_speaker",
                "--load=module-null-sink sink_name=caller_mouth",
                "--log-target=stderr",
                "--log-level=error",
            ])
            .status()
            .context("starting pulseaudio: is it installed? (cargo xtask setup installs it)")?;
        if !status.success() {
            bail!("pulseaudio did not start ({status})");
        }
        let started = Instant::now();
        while !server
            .command("pactl")
            .arg("info")
            .output()?
            .status
            .success()
        {
            if started.elapsed() > Duration::from_secs(10) {
                bail!("pulseaudio did not answer in 10 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for (what, name) in [
            ("set-default-sink", "agent_speaker"),
            ("set-default-source", "caller_mouth.monitor"),
        ] {
            if !server
                .command("pactl")
                .args([what, name])
                .status()?
                .success()
            {
                bail!("pactl {what} {name} failed");
            }
        }
        Ok(server)
    }

    /// A command that talks to this server (through its runtime directory, as ALSA's
    /// PulseAudio plugin finds it).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("XDG_RUNTIME_DIR", &self.runtime_dir);
        command
    }

    /// Plays a WAV file into the microphone, returning when it has played.
    pub fn say(&self, wav: &Path) -> Result<()> {
        let status = self
            .command("paplay")
            .args(["-d", "caller_mouth"])
            .arg(wav)
            .status()?;
        if !status.success() {
            bail!("paplay failed ({status})");
        }
        Ok(())
    }

    /// Starts recording what the speaker plays into `wav`; stop it with [`stop_recording`].
    pub fn record_speaker(&self, wav: &Path) -> Result<Child> {
        Ok(self
            .command("parecord")
            .args(["-d", "agent_speaker.monitor", "--file-format=wav"])
            .arg(wav)
            .spawn()?)
    }
}

/// Stops a recording so that its WAV file is complete.
pub fn stop_recording(mut recording: Child) -> Result<()> {
    let status = Command::new("kill")
        .args(["-INT", &recording.id().to_string()])
        .status()?;
    if !status.success() {
        bail!("could not stop parecord");
    }
    recording.wait()?;
    Ok(())
}

impl Drop for PulseAudio {
    fn drop(&mut self) {
        let _ = self.command("pulseaudio").arg("--kill").status();
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}
