//! The report's plots, as SVG files drawn with `plotters`.

use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::figures::{RoundRecord, AGENTS_ALONE, MAKE_ROOM_OFF, MAKE_ROOM_ON, VOICE_ALONE};
use crate::report::{BenchReport, STAGES};

const SIZE: (u32, u32) = (800, 440);

/// The plots a report links: (title, file name).
pub const PLOTS: [(&str, &str); 3] = [
    ("Voice to voice, CDF by condition", "voice_to_voice_cdf.svg"),
    ("Where a turn's time goes, mean seconds", "stages.svg"),
    ("KV use over each agent round", "kv_use.svg"),
];

/// Each condition's color, the same in every plot.
fn color_of(condition: &str) -> RGBColor {
    match condition {
        VOICE_ALONE => RGBColor(90, 90, 90),
        AGENTS_ALONE => RGBColor(44, 160, 44),
        MAKE_ROOM_OFF => RGBColor(214, 39, 40),
        MAKE_ROOM_ON => RGBColor(31, 119, 180),
        _ => RGBColor(150, 150, 150),
    }
}

/// Draws every plot of `report` into `dir`.
pub fn draw_all(report: &BenchReport, dir: &Path) -> Result<()> {
    voice_to_voice_cdf(report, &dir.join(PLOTS[0].1))?;
    stages(report, &dir.join(PLOTS[1].1))?;
    kv_use(&report.rounds, &dir.join(PLOTS[2].1))
}

fn failed<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A titled chart over `x` and `y` on a white `root` (each plot draws its own mesh).
fn chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    x: Range<f64>,
    y: Range<f64>,
    y_label_area: u32,
) -> Result<Chart<'a, 'b>> {
    root.fill(&WHITE).map_err(failed)?;
    ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(y_label_area)
        .build_cartesian_2d(x, y)
        .map_err(failed)
}

/// The series' legend at `position`, then the file written.
fn finish<'a, 'b>(
    mut chart: Chart<'a, 'b>,
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(failed)?;
    root.present().map_err(failed)
}

/// The share of turns answered within each time, one line per condition and number of
/// callers (the more callers, the fainter).
fn voice_to_voice_cdf(report: &BenchReport, path: &Path) -> Result<()> {
    let counts = report.figures.caller_counts();
    let series: Vec<(String, RGBAColor, Vec<f64>)> = counts
        .iter()
        .enumerate()
        .flat_map(|(k, &callers)| {
            [VOICE_ALONE, MAKE_ROOM_OFF, MAKE_ROOM_ON].map(move |c| (k, callers, c))
        })
        .map(|(k, callers, condition)| {
            let mut values: Vec<f64> = report
                .rounds
                .iter()
                .filter(|r| r.condition == condition && r.callers == callers)
                .flat_map(|r| r.turns.iter().map(|t| t.scored_s()))
                .collect();
            values.sort_by(f64::total_cmp);
            let color = color_of(condition).mix(1.0 - 0.45 * k as f64 / counts.len() as f64);
            (format!("{condition}, {callers} callers"), color, values)
        })
        .filter(|(_, _, values)| !values.is_empty())
        .collect();
    let x_max = series
        .iter()
        .flat_map(|(_, _, v)| v.last())
        .fold(1.0f64, |a, b| a.max(*b))
        * 1.05;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let mut chart = chart(&root, PLOTS[0].0, 0f64..x_max, 0f64..1.02f64, 56)?;
    chart
        .configure_mesh()
        .x_desc("seconds from the caller's stop to the reply's first audio")
        .y_desc("share of turns")
        .draw()
        .map_err(failed)?;
    for slo in &report.figures.slos {
        let (at, callers) = (slo.slo_s, slo.callers);
        chart
            .draw_series(LineSeries::new(
                [(at, 0.0), (at, 1.02)],
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(failed)?
            .label(format!("SLO {at:.2} s, {callers} callers"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    for (name, color, values) in &series {
        let color = *color;
        let n = values.len() as f64;
        let mut steps = vec![(0.0, 0.0)];
        for (k, v) in values.iter().enumerate() {
            steps.push((*v, k as f64 / n));
            steps.push((*v, (k + 1) as f64 / n));
        }
        steps.push((x_max, 1.0));
        chart
            .draw_series(LineSeries::new(steps, color.stroke_width(2)))
            .map_err(failed)?
            .label(format!("{name} ({} turns)", values.len()))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    finish(chart, &root, SeriesLabelPosition::LowerRight)
}

/// One bar per condition, each stage's mean a segment of it.
fn stages(report: &BenchReport, path: &Path) -> Result<()> {
    let conditions: Vec<_> = report
        .figures
        .conditions
        .iter()
        .filter(|c| c.summary.turns > 0)
        .collect();
    let longest = conditions
        .iter()
        .map(|c| c.stage_means_s.iter().sum::<f64>())
        .fold(1.0f64, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let names: Vec<String> = conditions
        .iter()
        .map(|c| format!("{}, {}", c.condition, c.callers))
        .collect();
    let bars = conditions.len().max(1) as f64;
    let mut chart = chart(&root, PLOTS[1].0, 0f64..longest * 1.05, 0f64..bars, 120)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(conditions.len().max(1) * 2 + 1)
        .y_label_formatter(&|y| {
            let i = y - 0.5;
            if (i - i.round()).abs() < 1e-6 && i >= 0.0 {
                names.get(i.round() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("seconds (means over the condition's answered turns)")
        .draw()
        .map_err(failed)?;
    for (s, stage) in STAGES.iter().enumerate() {
        let color = Palette99::pick(s).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = conditions
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let from: f64 = c.stage_means_s[..s].iter().sum();
                let to = from + c.stage_means_s[s];
                Rectangle::new(
                    [(from, i as f64 + 0.2), (to, i as f64 + 0.8)],
                    color.filled(),
                )
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(failed)?
            .label(*stage)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    finish(chart, &root, SeriesLabelPosition::UpperRight)
}

/// KV use as a share of the budget through each round beside the agents.
fn kv_use(rounds: &[RoundRecord], path: &Path) -> Result<()> {
    let agent_rounds: Vec<(usize, &RoundRecord)> = rounds
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.agent_calls.is_empty() && !r.samples.is_empty())
        .collect();
    let t_max = agent_rounds
        .iter()
        .flat_map(|(_, r)| r.samples.last())
        .fold(1.0f64, |a, s| a.max(s.t_s));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let mut chart = chart(&root, PLOTS[2].0, 0f64..t_max, 0f64..1.1f64, 56)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the round")
        .y_desc("KV use ÷ budget")
        .draw()
        .map_err(failed)?;
    for (n, round) in agent_rounds {
        let color = color_of(&round.condition);
        // Later rounds of a condition are drawn fainter, so that each can be told apart.
        let style = color.mix(if n <= 2 { 0.9 } else { 0.5 }).stroke_width(1);
        let points = round.samples.iter().map(|s| {
            (
                s.t_s,
                s.kv_used_tokens as f64 / s.kv_budget_tokens.max(1) as f64,
            )
        });
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(failed)?
            .label(format!(
                "round {}: {}, {} callers",
                n + 1,
                round.condition,
                round.callers
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    finish(chart, &root, SeriesLabelPosition::LowerRight)
}
