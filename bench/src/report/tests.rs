//! The report's wording.

use super::*;
use crate::figures::AGENTS_ALONE;

fn round(condition: &str, callers: usize, window_s: f64) -> RoundRecord {
    RoundRecord {
        condition: condition.into(),
        seed: None,
        callers,
        window_s,
        duration_s: window_s,
        turns: Vec::new(),
        agent_calls: Vec::new(),
        samples: Vec::new(),
    }
}

fn report(rounds: Vec<RoundRecord>) -> BenchReport {
    BenchReport {
        command: String::new(),
        commit: None,
        config: Value::Null,
        window_s: 120.0,
        figures: Figures::default(),
        rounds,
    }
}

#[test]
fn the_windows_are_told_by_number_of_callers_where_they_differ() {
    let same = report(vec![
        round(VOICE_ALONE, 2, 40.0),
        round(AGENTS_ALONE, 0, 120.0),
        round(MAKE_ROOM_OFF, 2, 120.0),
        round(MAKE_ROOM_ON, 4, 0.0),
    ]);
    assert_eq!(windows(&same), "120 s");
    let differ = report(vec![
        round(AGENTS_ALONE, 0, 120.0),
        round(MAKE_ROOM_ON, 2, 120.0),
        round(VOICE_ALONE, 4, 18.0),
        round(MAKE_ROOM_OFF, 4, 75.0),
    ]);
    assert_eq!(
        windows(&differ),
        "120 s with 2 callers, 75 s with 4 callers"
    );
}
