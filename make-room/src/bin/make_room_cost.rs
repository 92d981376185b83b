//! The scheduler's own cost per step, make-room off against on, over the same random
//! workloads: the time `schedule` and `finish_step` take, without any model.
//!
//! ```text
//! make_room_cost [--workloads 20000] [--seed 0]
//! ```

use std::time::{Duration, Instant};

use sublet_make_room::sim::{random_workload, Arrival};
use sublet_make_room::{PolicyConfig, Scheduler, Switches};

/// Steps a workload to its end, timing only the scheduler's calls.
fn time_workload(seed: u64, switches: &Switches) -> (Duration, u64) {
    let workload = random_workload(seed);
    let mut scheduler = Scheduler::new(PolicyConfig {
        switches: switches.clone(),
        ..workload.config.clone()
    });
    let (mut now, mut next, mut spent, mut steps) = (0u64, 0usize, Duration::ZERO, 0u64);
    while steps < 200_000 {
        while next < workload.arrivals.len() && workload.arrivals[next].0 <= now {
            match &workload.arrivals[next].1 {
                Arrival::Request(r) => {
                    let _ = scheduler.add(r.clone(), now);
                }
                Arrival::Hint(p) => scheduler.turn_hint(*p, now),
            }
            next += 1;
        }
        if scheduler.is_idle() {
            match workload.arrivals.get(next) {
                Some((at, _)) => {
                    now = now.max(*at);
                    continue;
                }
                None => break,
            }
        }
        let started = Instant::now();
        let plan = scheduler.schedule(now);
        now += sublet_make_room::sim::step_cost_ms(&plan) + 1;
        scheduler.finish_step(&plan, now, &[]);
        spent += started.elapsed();
        steps += 1;
    }
    (spent, steps)
}

fn main() {
    let mut workloads = 20_000u64;
    let mut seed = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--workloads", Some(v)) => workloads = v,
            ("--seed", Some(v)) => seed = v,
            _ => {
                eprintln!("usage: make_room_cost [--workloads N] [--seed S]");
                std::process::exit(2);
            }
        }
    }
    // Alternate off and on per workload so both see the same machine noise.
    let (mut off, mut on) = ((Duration::ZERO, 0u64), (Duration::ZERO, 0u64));
    for s in seed..seed + workloads {
        let (t, n) = time_workload(s, &Switches::default());
        off = (off.0 + t, off.1 + n);
        let (t, n) = time_workload(s, &Switches::all());
        on = (on.0 + t, on.1 + n);
    }
    let per_step = |(t, n): (Duration, u64)| t.as_secs_f64() * 1e6 / n.max(1) as f64;
    println!("workloads:        {workloads}");
    println!(
        "make-room off:    {:.2} µs a step over {} steps",
        per_step(off),
        off.1
    );
    println!(
        "make-room on:     {:.2} µs a step over {} steps",
        per_step(on),
        on.1
    );
    println!("on / off:         {:.2}", per_step(on) / per_step(off));
}
