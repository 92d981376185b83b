//! The scheduler's trace: where a turn's time went, step by step.

/// A line per event (a caller's request sent, a request added, a step planned, a pass
/// handed out), with the milliseconds since the scheduler started: where a turn's time
/// went, step by step. A caller's request is `sent` when it left for the engine, a line
/// written when the scheduler next takes a request, so it may follow later lines.
/// Written when `SUBLET_SCHEDULER_TRACE` names a file.
pub(super) struct Trace(std::io::BufWriter<std::fs::File>);

impl Trace {
    const ENV: &'static str = "SUBLET_SCHEDULER_TRACE";

    /// Whether this process writes a trace: read once, so that callers' requests are
    /// dated for it only then.
    pub(super) fn wanted() -> bool {
        static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *WANTED.get_or_init(|| std::env::var_os(Self::ENV).is_some())
    }

    pub(super) fn from_env() -> Option<Self> {
        let path = std::env::var_os(Self::ENV)?;
        match std::fs::File::create(&path) {
            Ok(file) => Some(Self(std::io::BufWriter::new(file))),
            Err(e) => {
                tracing::warn!("{}: cannot write {path:?}: {e}", Self::ENV);
                None
            }
        }
    }

    pub(super) fn line(&mut self, at_ms: u64, event: std::fmt::Arguments) {
        use std::io::Write;
        let _ = writeln!(self.0, "{at_ms} {event}");
        let _ = self.0.flush();
    }
}
