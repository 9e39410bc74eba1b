//! The simulated schedule as a picture: one row per stage (labelled with its GPU), forward and
//! backward passes as coloured boxes labelled with their micro-batch, transfers implied by the
//! gaps, idle time as the background, and a time axis in milliseconds under the rows. Plain SVG
//! text, so it needs no library and opens in any browser.

use std::fmt::Write;

use super::simulate::Simulation;
use pipecut_cost::order::OpKind;

const ROW_HEIGHT: f64 = 28.0;
/// Room for a row label of this many characters at the 11 px font (about 6.5 px a character).
const LABEL_CHAR_WIDTH: f64 = 6.5;
const PLOT_WIDTH: f64 = 960.0;
/// The axis under the rows: its line, ticks and labels.
const AXIS_HEIGHT: f64 = 30.0;
/// About this many ticks on the time axis; the step is rounded to 1, 2 or 5 × 10^n ms.
const TARGET_TICKS: f64 = 8.0;
const FORWARD_COLOUR: &str = "#4e79a7";
const BACKWARD_COLOUR: &str = "#59a14f";
/// Zero-bubble's weight-gradient passes: a lighter green, being the other half of a backward.
const WEIGHT_GRADIENT_COLOUR: &str = "#8cd17d";
const IDLE_COLOUR: &str = "#eeeeee";

/// Text for SVG (XML 1.0) content and attributes: markup characters as entities, and the control
/// characters XML 1.0 forbids even as references (all below U+0020 but tab, newline and return)
/// replaced by U+FFFD, so that a model's names can never make the file invalid.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A tick step in ms near `span_ms / TARGET_TICKS`, rounded to 1, 2 or 5 × 10^n.
fn tick_step_ms(span_ms: f64) -> f64 {
    let raw = span_ms / TARGET_TICKS;
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&step| step >= raw)
        .unwrap_or(10.0 * magnitude)
}

/// A tick label: as many decimals as the step needs, no more.
fn tick_label(ms: f64, step_ms: f64) -> String {
    let decimals = (-step_ms.log10().floor()).max(0.0) as usize;
    format!("{ms:.decimals$}")
}

/// Renders the simulation as SVG. `title` is printed above the rows; `row_labels` names each
/// stage's row (e.g. `stage 0 · GPU 3 (H100-SXM)`), `stage k` where one is missing.
pub fn timeline_svg(sim: &Simulation, title: &str, row_labels: &[String]) -> String {
    let devices = sim.peak_in_flight.len();
    let scale = if sim.step_secs > 0.0 {
        PLOT_WIDTH / sim.step_secs
    } else {
        0.0
    };
    let labels: Vec<String> = (0..devices)
        .map(|k| {
            row_labels
                .get(k)
                .cloned()
                .unwrap_or_else(|| format!("stage {k}"))
        })
        .collect();
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let label_width = (longest as f64 * LABEL_CHAR_WIDTH + 12.0).max(60.0);
    let rows_bottom = 28.0 + devices as f64 * ROW_HEIGHT;
    let height = rows_bottom + AXIS_HEIGHT + 24.0;
    let width = label_width + PLOT_WIDTH + 30.0;
    let mut svg = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="4" y="16" font-size="13">{} — step {:.3} ms, bubble {:.1}%</text>"#,
        escape(title),
        sim.step_secs * 1e3,
        sim.bubble_fraction * 100.0
    );
    for (device, label) in labels.iter().enumerate() {
        let y = 28.0 + device as f64 * ROW_HEIGHT;
        let _ = writeln!(svg, r#"<g class="row" data-device="{device}">"#);
        let _ = writeln!(
            svg,
            r#"<text x="4" y="{}">{}</text>"#,
            y + 17.0,
            escape(label)
        );
        let _ = writeln!(
            svg,
            r#"<rect x="{label_width}" y="{y}" width="{PLOT_WIDTH}" height="{}" fill="{IDLE_COLOUR}"/>"#,
            ROW_HEIGHT - 4.0
        );
        for op in sim.ops.iter().filter(|o| o.device == device) {
            let x = label_width + op.start_secs * scale;
            let w = ((op.end_secs - op.start_secs) * scale).max(0.5);
            let (colour, letter) = match op.kind {
                OpKind::Forward => (FORWARD_COLOUR, 'F'),
                OpKind::Backward => (BACKWARD_COLOUR, 'B'),
                OpKind::WeightGradient => (WEIGHT_GRADIENT_COLOUR, 'W'),
            };
            let _ = write!(
                svg,
                r#"<rect x="{x:.2}" y="{y}" width="{w:.2}" height="{}" fill="{colour}" stroke="white" stroke-width="0.5">"#,
                ROW_HEIGHT - 4.0
            );
            let _ = write!(
                svg,
                "<title>{letter}{} stage {} {:.3}-{:.3} ms</title></rect>",
                op.microbatch,
                op.stage,
                op.start_secs * 1e3,
                op.end_secs * 1e3
            );
            if w > 14.0 {
                let _ = write!(
                    svg,
                    r#"<text x="{:.2}" y="{}" fill="white">{letter}{}</text>"#,
                    x + 2.0,
                    y + 16.0,
                    op.microbatch
                );
            }
            svg.push('\n');
        }
        let _ = writeln!(svg, "</g>");
    }
    time_axis(&mut svg, sim.step_secs * 1e3, label_width, rows_bottom);
    let legend_y = height - 10.0;
    let _ = writeln!(
        svg,
        r##"<text x="4" y="{legend_y}"><tspan fill="{FORWARD_COLOUR}">■ forward</tspan>  <tspan fill="{BACKWARD_COLOUR}">■ backward</tspan>  <tspan fill="{WEIGHT_GRADIENT_COLOUR}">■ weight gradient (zero-bubble)</tspan>  <tspan fill="#999">■ idle (waiting for a transfer or a dependency)</tspan></text>"##
    );
    svg.push_str("</svg>\n");
    svg
}

/// The time axis under the rows: a line, ticks every 1, 2 or 5 × 10^n ms, and their labels.
fn time_axis(svg: &mut String, span_ms: f64, left: f64, top: f64) {
    let y = top + 4.0;
    let _ = writeln!(svg, r#"<g class="time-axis">"#);
    let _ = writeln!(
        svg,
        r#"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="black" stroke-width="0.8"/>"#,
        left + PLOT_WIDTH
    );
    if span_ms > 0.0 {
        let step = tick_step_ms(span_ms);
        let ticks = (span_ms / step + 1e-9).floor() as usize;
        for i in 0..=ticks {
            let ms = i as f64 * step;
            let x = left + ms / span_ms * PLOT_WIDTH;
            let _ = writeln!(
                svg,
                r#"<line class="tick" x1="{x:.2}" y1="{y}" x2="{x:.2}" y2="{}" stroke="black" stroke-width="0.8"/><text x="{x:.2}" y="{}" text-anchor="middle">{}</text>"#,
                y + 5.0,
                y + 17.0,
                tick_label(ms, step)
            );
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="end">time (ms)</text>"#,
        left + PLOT_WIDTH + 26.0,
        y + 17.0
    );
    let _ = writeln!(svg, "</g>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{simulate, PipelineSchedule, StageTimes};

    #[test]
    fn one_row_per_device_and_balanced_tags() {
        let times = StageTimes {
            forward_secs: vec![1e-3; 3],
            backward_secs: vec![2e-3; 3],
            send_secs: vec![1e-4; 2],
        };
        let sim = simulate(&times, PipelineSchedule::OneFOneB, 4).unwrap();
        let labels: Vec<String> = (0..3)
            .map(|k| format!("stage {k} · GPU {} (L4)", k + 4))
            .collect();
        let svg = timeline_svg(&sim, "3 stages <1F1B>", &labels);
        assert_eq!(svg.matches(r#"class="row""#).count(), 3);
        assert_eq!(
            svg.matches("<rect").count(),
            svg.matches("</rect>").count() + 3
        );
        assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
        assert!(svg.contains("&lt;1F1B&gt;") && svg.ends_with("</svg>\n"));
        // Rows say which stage runs on which GPU, not "device N".
        assert!(svg.contains(">stage 2 · GPU 6 (L4)</text>"), "{svg}");
        assert!(!svg.contains(">device "), "{svg}");
    }

    #[test]
    fn the_time_axis_has_ticks_in_ms_across_the_step() {
        let times = StageTimes {
            forward_secs: vec![1e-3; 2],
            backward_secs: vec![0.0; 2],
            send_secs: vec![0.0],
        };
        let sim = simulate(&times, PipelineSchedule::GPipe, 4).unwrap();
        // 5 ms: ticks every 1 ms from 0 to 5.
        assert!((sim.step_secs - 5e-3).abs() < 1e-12, "{}", sim.step_secs);
        let svg = timeline_svg(&sim, "t", &[]);
        assert!(svg.contains("time (ms)"), "{svg}");
        assert_eq!(svg.matches(r#"class="tick""#).count(), 6, "{svg}");
        assert!(
            svg.contains(">0</text>") && svg.contains(">5</text>"),
            "{svg}"
        );
        assert_eq!(tick_step_ms(5.0), 1.0);
        assert_eq!(tick_step_ms(90.0), 20.0);
        assert_eq!(tick_step_ms(0.3), 0.05);
    }
}
