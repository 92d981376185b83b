//! What the server has served, in Prometheus' text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Default, Clone, Copy)]
struct PerPriority {
    started: u64,
    finished: u64,
    failed: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// Counters kept by the server (the engine's own scheduler counters join them later).
#[derive(Debug, Default)]
pub struct Metrics {
    next_id: AtomicU64,
    by_priority: Mutex<BTreeMap<i32, PerPriority>>,
    refused: Mutex<BTreeMap<u16, u64>>,
}

impl Metrics {
    fn with<R>(&self, priority: i32, f: impl FnOnce(&mut PerPriority) -> R) -> R {
        let mut map = self.by_priority.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry(priority).or_default())
    }

    /// A request was admitted; returns its number.
    pub fn started(&self, priority: i32) -> u64 {
        self.with(priority, |p| p.started += 1);
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn finished(&self, priority: i32, prompt_tokens: usize, completion_tokens: usize) {
        self.with(priority, |p| {
            p.finished += 1;
            p.prompt_tokens += prompt_tokens as u64;
            p.completion_tokens += completion_tokens as u64;
        });
    }

    pub fn failed(&self, priority: i32) {
        self.with(priority, |p| p.failed += 1);
    }

    /// A request refused before it reached the engine, by HTTP status.
    pub fn refused(&self, status: u16) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    pub fn render(&self) -> String {
        let map = self
            .by_priority
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = String::new();
        type Value = fn(&PerPriority) -> u64;
        let families: [(&str, &str, &str, Value); 6] = [
            (
                "sublet_requests_started_total",
                "Chat requests admitted to the engine.",
                "counter",
                |p| p.started,
            ),
            (
                "sublet_requests_finished_total",
                "Chat requests answered to the end.",
                "counter",
                |p| p.finished,
            ),
            (
                "sublet_requests_failed_total",
                "Chat requests that failed in the engine.",
                "counter",
                |p| p.failed,
            ),
            (
                "sublet_requests_in_flight",
                "Chat requests admitted and not yet ended.",
                "gauge",
                |p| p.started.saturating_sub(p.finished + p.failed),
            ),
            (
                "sublet_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                "counter",
                |p| p.prompt_tokens,
            ),
            (
                "sublet_completion_tokens_total",
                "Tokens generated for finished requests.",
                "counter",
                |p| p.completion_tokens,
            ),
        ];
        for (name, help, kind, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (priority, p) in &map {
                let _ = writeln!(out, "{name}{{priority=\"{priority}\"}} {}", value(p));
            }
        }
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let _ = writeln!(
            out,
            "# HELP sublet_requests_refused_total Requests refused before the engine, by HTTP status.\n# TYPE sublet_requests_refused_total counter"
        );
        for (status, n) in refused {
            let _ = writeln!(
                out,
                "sublet_requests_refused_total{{status=\"{status}\"}} {n}"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_per_priority() {
        let m = Metrics::default();
        m.started(1);
        m.started(1);
        m.started(0);
        m.finished(1, 10, 5);
        m.refused(400);
        let text = m.render();
        assert!(
            text.contains("sublet_requests_started_total{priority=\"1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("sublet_requests_in_flight{priority=\"1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sublet_completion_tokens_total{priority=\"1\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("sublet_requests_refused_total{status=\"400\"} 1"),
            "{text}"
        );
    }
}
