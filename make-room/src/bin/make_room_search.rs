//! Searches random workloads for stalls, lost requests, KV overruns and departures from
//! stock scheduling caused by make-room's switches; prints what it found.
//!
//! ```text
//! make_room_search [--workloads 1000000] [--seed 0]
//! ```

use std::process::ExitCode;
use std::time::Instant;

use sublet_make_room::sim;

fn main() -> ExitCode {
    let mut workloads = 1_000_000u64;
    let mut seed = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (arg.as_str(), value) {
            ("--workloads", Some(v)) => workloads = v,
            ("--seed", Some(v)) => seed = v,
            _ => {
                eprintln!("usage: make_room_search [--workloads N] [--seed S]");
                return ExitCode::from(2);
            }
        }
    }
    let started = Instant::now();
    let summary = sim::search(seed, workloads, |s| {
        eprint!(
            "\r{} / {workloads} workloads, {} caused by the options ({:.0} s)",
            s.workloads,
            s.caused_by_options,
            started.elapsed().as_secs_f64()
        );
    });
    eprintln!();
    println!("workloads checked:                   {}", summary.workloads);
    println!(
        "stalls or losses caused by options:  {}",
        summary.caused_by_options
    );
    println!(
        "failures with every option off:      {}",
        summary.with_options_off
    );
    println!(
        "equal-priority runs unlike stock:    {}",
        summary.stock_mismatches
    );
    if let Some((seed, what)) = &summary.first_failure {
        println!("first failure: seed {seed}: {what}");
    }
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    if summary.caused_by_options + summary.stock_mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
