//! The turn's transcript taken as the caller stops speaking, while the end of the turn is
//! still being decided: its last words are the end-of-turn rules' second signal (a
//! question ends the turn at once, a trailing "and" keeps it open), and when the caller
//! says nothing more it is the turn's transcript, so none is left to take after the end.
//!
//! Whisper runs on a thread of its own with a context of its own, and starts before the
//! stop is certain: once the caller has been quiet for a moment
//! ([`EARLY_TRANSCRIPT_AFTER_S`]), the turn so far is sent to it, the rest of its padding
//! ([`TURN_PAD_S`] after the last speech) as silence. The detector confirms the stop only
//! at 0.4 s of quiet and then scores it with Smart Turn; the transcript is made meanwhile,
//! beside that score instead of after it, and on one core Whisper's encoder alone takes
//! about 0.25 s of a 3 s turn, so every tenth of a second it starts sooner is a tenth off
//! the end of a turn the rules are sure of. A pause the caller ends sooner calls that transcription off as they go on (Whisper
//! stops within one of its operations), so a caller who pauses often costs a part of one
//! core, and the worker is free for their next stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use sublet_audio::SPEECH_RATE;
use sublet_stt::Transcriber;
use sublet_turn_detect::{transcript_cue, TurnDetector, TURN_PAD_S};

use crate::pool::Pooled;

/// Quiet after the caller's last speech at which their words so far are transcribed, by
/// default (`AgentConfig::early_transcript_after_s`): four of the VAD's 32 ms frames. The
/// 13 turns of the bundled calls came out word for word the same with their padding's last
/// 0.13 s as silence.
pub const EARLY_TRANSCRIPT_AFTER_S: f64 = 0.1;

/// A call's early transcripts.
pub(crate) struct EarlyTranscript {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Done>,
    worker: Option<JoinHandle<()>>,
    /// The job the worker holds, not yet collected.
    in_flight: Option<InFlight>,
    /// The latest job collected.
    finished: Option<Done>,
    /// Jobs called off since the last turn's end.
    called_off: usize,
}

/// The turn up to a stop, to transcribe.
struct Job {
    speech_end_s: f64,
    audio: Vec<f32>,
    /// Set when the caller went on speaking: the transcription is called off.
    stop: Arc<AtomicBool>,
}

/// The job the worker holds.
struct InFlight {
    speech_end_s: f64,
    stop: Arc<AtomicBool>,
}

/// A job's transcript (`None`: called off).
struct Done {
    speech_end_s: f64,
    text: Result<Option<String>>,
    took: Duration,
}

/// The transcript of the turn as it stood at one stop.
pub(crate) struct AtStop<'a> {
    pub(crate) text: &'a str,
    /// When the transcript was ready, in seconds after the stop was decided (0 when it
    /// was ready before).
    pub(crate) after_decision_s: f64,
    /// It was started before the stop was decided.
    pub(crate) ahead: bool,
}

impl EarlyTranscript {
    /// Loads the worker's Whisper context and starts its thread.
    pub(crate) fn start(stt: Pooled<Transcriber>) -> Result<Self> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, done) = mpsc::channel::<Done>();
        let worker = std::thread::Builder::new()
            .name("early-transcript".into())
            .spawn(move || {
                let mut stt = stt;
                for job in inbox {
                    let started = Instant::now();
                    let text = stt.transcribe_until(&job.audio, Some(&job.stop));
                    let done = Done {
                        speech_end_s: job.speech_end_s,
                        text,
                        took: started.elapsed(),
                    };
                    if outbox.send(done).is_err() {
                        break;
                    }
                }
            })
            .context("starting the early transcript's thread")?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            worker: Some(worker),
            in_flight: None,
            finished: None,
            called_off: 0,
        })
    }

    /// The caller has been quiet since `speech_end_s` for a moment: starts the turn's
    /// transcript up to there, unless the worker is busy or has it already (the caller
    /// calls off a job for an earlier stop first, [`EarlyTranscript::call_off_before`]).
    pub(crate) fn speculate(&mut self, detector: &TurnDetector, speech_end_s: f64) -> Result<()> {
        self.collect_ready();
        let done = self.finished.as_ref();
        if self.in_flight.is_none() && !done.is_some_and(|d| same(d.speech_end_s, speech_end_s)) {
            self.send(detector, speech_end_s)?;
        }
        Ok(())
    }

    /// The caller speaks on past a stop whose transcript is being made: it is no longer the
    /// turn's, so it is called off.
    pub(crate) fn call_off_before(&mut self, voiced_until_s: f64) {
        if let Some(job) = &self.in_flight {
            if job.speech_end_s < voiced_until_s - 1e-9 {
                job.stop.store(true, Ordering::Relaxed);
            }
        }
    }

    /// At a stop: the turn so far transcribed (waiting for the worker if it is not done),
    /// and the detector given the words' cue. `None` when the turn holds no audio.
    pub(crate) fn at_stop(
        &mut self,
        detector: &mut TurnDetector,
        speech_end_s: f64,
    ) -> Result<Option<AtStop<'_>>> {
        let decided = Instant::now();
        let Some(ahead) = self.finish(detector, speech_end_s)? else {
            return Ok(None);
        };
        let done = self.finished.as_ref().expect("collected above");
        let text = match &done.text {
            Ok(Some(text)) => text.as_str(),
            Ok(None) => unreachable!("a transcript called off is not kept"),
            Err(e) => return Err(anyhow!("early transcript: {e:#}")),
        };
        detector.set_transcript_cue(speech_end_s, transcript_cue(text));
        Ok(Some(AtStop {
            text,
            after_decision_s: decided.elapsed().as_secs_f64(),
            ahead,
        }))
    }

    /// The turn's words up to speech that ended at `speech_end_s`, transcribed as its stop's
    /// early transcript (started now if it was not yet, waiting for it): `None` when the
    /// detector holds no turn or the transcription failed. For another question about the
    /// same speech, such as whether an interruption held words, so that Whisper does not
    /// transcribe the same audio twice at once, and the answer serves the stop too.
    pub(crate) fn text_at(
        &mut self,
        detector: &TurnDetector,
        speech_end_s: f64,
    ) -> Result<Option<&str>> {
        if self.finish(detector, speech_end_s)?.is_none() {
            return Ok(None);
        }
        Ok(match &self.finished {
            Some(Done {
                text: Ok(Some(text)),
                ..
            }) => Some(text.as_str()),
            _ => None,
        })
    }

    /// Waits until the transcript of the stop at `speech_end_s` is in `finished`, sending it
    /// first if no job holds it: `Some(ahead)`, whether it was started before this call, or
    /// `None` when the detector holds no turn.
    fn finish(&mut self, detector: &TurnDetector, speech_end_s: f64) -> Result<Option<bool>> {
        self.call_off_before(speech_end_s);
        self.collect_ready();
        let mut ahead = true;
        loop {
            match (&self.finished, self.in_flight.is_some()) {
                (Some(done), _) if same(done.speech_end_s, speech_end_s) => return Ok(Some(ahead)),
                (_, true) => self.collect_one()?,
                (_, false) => {
                    ahead = false;
                    if !self.send(detector, speech_end_s)? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// At the end of a turn whose speech ended at `speech_end_s`: the transcript taken at
    /// that stop (the turn's audio is the same).
    pub(crate) fn for_turn(&mut self, speech_end_s: f64) -> Option<String> {
        let done = self
            .finished
            .take_if(|d| same(d.speech_end_s, speech_end_s))?;
        done.text.ok().flatten()
    }

    /// Transcripts called off since the last call, as a turn ends.
    pub(crate) fn take_called_off(&mut self) -> usize {
        std::mem::take(&mut self.called_off)
    }

    /// Sends the turn up to `speech_end_s`, its padding not yet heard as silence; false
    /// when the detector holds no turn.
    fn send(&mut self, detector: &TurnDetector, speech_end_s: f64) -> Result<bool> {
        let Some(mut audio) = detector.turn_audio(speech_end_s) else {
            return Ok(false);
        };
        let unheard_s = (speech_end_s + TURN_PAD_S - detector.position_s()).max(0.0);
        audio.resize(
            audio.len() + (unheard_s * f64::from(SPEECH_RATE)).round() as usize,
            0.0,
        );
        let jobs = self
            .jobs
            .as_ref()
            .expect("the sender lives as long as self");
        let stop = Arc::new(AtomicBool::new(false));
        jobs.send(Job {
            speech_end_s,
            audio,
            stop: Arc::clone(&stop),
        })
        .map_err(|_| anyhow!("the early transcript's thread has stopped"))?;
        self.in_flight = Some(InFlight { speech_end_s, stop });
        Ok(true)
    }

    /// Takes a finished job without waiting, if there is one.
    fn collect_ready(&mut self) {
        if let Ok(done) = self.done.try_recv() {
            self.keep(done);
        }
    }

    /// Waits for the job in flight.
    fn collect_one(&mut self) -> Result<()> {
        let done = self
            .done
            .recv()
            .map_err(|_| anyhow!("the early transcript's thread has stopped"))?;
        self.keep(done);
        Ok(())
    }

    fn keep(&mut self, done: Done) {
        self.in_flight = None;
        let called_off = matches!(done.text, Ok(None));
        tracing::debug!(
            speech_end_s = done.speech_end_s,
            took_ms = done.took.as_millis() as u64,
            called_off,
            "early transcript"
        );
        match called_off {
            true => self.called_off += 1,
            false => self.finished = Some(done),
        }
    }
}

/// Two call times are the same moment (times computed from the same frame counts).
pub(crate) fn same(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

impl Drop for EarlyTranscript {
    fn drop(&mut self) {
        // Closing the job channel ends the worker once its current job is done.
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}
