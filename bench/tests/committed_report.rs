//! The bench reports committed in `docs/`: every figure in each `summary.json` is
//! recomputed from the per-turn, per-call and per-sample records beside it, and its
//! `report.md` is exactly what those figures render to.

use std::path::PathBuf;

use serde_json::Value;
use sublet_bench::figures::{figures, AGENTS_ALONE, MAKE_ROOM_ON};
use sublet_bench::plots::PLOTS;
use sublet_bench::report::{markdown, BenchReport};

/// The committed runs: the default one, and one with AIPerf as the agents' driver.
const RUNS: &[&str] = &["docs/bench", "docs/bench-aiperf"];

fn committed() -> Vec<(BenchReport, PathBuf)> {
    RUNS.iter().map(|run| committed_in(run)).collect()
}

fn committed_in(run: &str) -> (BenchReport, PathBuf) {
    // `cargo test` gives the crate's folder at run time; the one compiled in may be another
    // checkout's (cargo reuses a shared target directory's build for the same sources).
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
        .join("..")
        .join(run);
    let text = std::fs::read_to_string(dir.join("summary.json"))
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.join("summary.json").display()));
    (
        serde_json::from_str(&text).expect("summary.json parses"),
        dir,
    )
}

/// Whether two JSON values are the same, numbers within a relative 1e-9 (a float's trip
/// through JSON text may move its last bit).
fn same(a: &Value, b: &Value, at: &str) -> Result<(), String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            if (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0) {
                Ok(())
            } else {
                Err(format!("{at}: {x} against {y}"))
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .try_for_each(|(i, (x, y))| same(x, y, &format!("{at}[{i}]"))),
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            x.iter().try_for_each(|(k, v)| {
                same(
                    v,
                    y.get(k).ok_or(format!("{at}.{k} missing"))?,
                    &format!("{at}.{k}"),
                )
            })
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{at}: {a} against {b}")),
    }
}

#[test]
fn every_figure_is_recomputed_from_the_records() {
    for (report, dir) in committed() {
        assert!(report.rounds.len() >= 3, "a voice-alone round and a pair");
        // Every round has turns but the agents-alone one, which has agents' calls instead.
        assert!(report
            .rounds
            .iter()
            .all(|r| if r.condition == AGENTS_ALONE {
                r.callers == 0 && r.turns.is_empty() && !r.agent_calls.is_empty()
            } else {
                !r.turns.is_empty()
            }));
        let recomputed = figures(&report.rounds, report.window_s);
        same(
            &serde_json::to_value(&recomputed).unwrap(),
            &serde_json::to_value(&report.figures).unwrap(),
            "figures",
        )
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
}

#[test]
fn the_check_notices_a_changed_turn() {
    let (mut report, _) = committed_in(RUNS[0]);
    // The slowest turn of a make-room round, not timed out: a second more moves its
    // round's slowest turn (an off round's p95 and maximum are mostly the 30 s timeout).
    let slowest = report
        .rounds
        .iter_mut()
        .filter(|r| r.condition == MAKE_ROOM_ON)
        .flat_map(|r| r.turns.iter_mut())
        .filter(|t| t.scored_s() < 29.0)
        .max_by(|a, b| a.scored_s().total_cmp(&b.scored_s()))
        .unwrap();
    slowest.voice_to_voice_s = Some(slowest.scored_s() + 1.0);
    let recomputed = figures(&report.rounds, report.window_s);
    let error = same(
        &serde_json::to_value(&recomputed).unwrap(),
        &serde_json::to_value(&report.figures).unwrap(),
        "figures",
    )
    .unwrap_err();
    assert!(error.contains("voice_to_voice"), "{error}");
}

#[test]
fn the_markdown_report_renders_those_figures_and_its_plots_exist() {
    for (report, dir) in committed() {
        let committed_md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        let rendered = markdown(&report, &PLOTS);
        assert!(
            committed_md.starts_with(&rendered),
            "{}/report.md differs from what summary.json renders to",
            dir.display()
        );
        for (_, file) in PLOTS {
            let svg = std::fs::read_to_string(dir.join(file)).unwrap();
            assert!(svg.contains("<svg") && svg.contains("</svg>"), "{file}");
        }
    }
}
