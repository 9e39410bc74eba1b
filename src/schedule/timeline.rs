//! The simulated schedule as a picture: one row per device, forward and backward passes as
//! coloured boxes labelled with their micro-batch, transfers implied by the gaps, idle time as
//! the background. Plain SVG text, so it needs no library and opens in any browser.

use std::fmt::Write;

use super::simulate::{OpKind, Simulation};

const ROW_HEIGHT: f64 = 28.0;
const LABEL_WIDTH: f64 = 90.0;
const PLOT_WIDTH: f64 = 960.0;
const FORWARD_COLOUR: &str = "#4e79a7";
const BACKWARD_COLOUR: &str = "#59a14f";
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

/// Renders the simulation as SVG. `title` is printed above the rows.
pub fn timeline_svg(sim: &Simulation, title: &str) -> String {
    let devices = sim.peak_in_flight.len();
    let scale = if sim.step_secs > 0.0 {
        PLOT_WIDTH / sim.step_secs
    } else {
        0.0
    };
    let height = 60.0 + devices as f64 * ROW_HEIGHT;
    let width = LABEL_WIDTH + PLOT_WIDTH + 20.0;
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
    for device in 0..devices {
        let y = 28.0 + device as f64 * ROW_HEIGHT;
        let _ = writeln!(svg, r#"<g class="row" data-device="{device}">"#);
        let _ = writeln!(
            svg,
            r#"<text x="4" y="{}">device {device}</text>"#,
            y + 17.0
        );
        let _ = writeln!(
            svg,
            r#"<rect x="{LABEL_WIDTH}" y="{y}" width="{PLOT_WIDTH}" height="{}" fill="{IDLE_COLOUR}"/>"#,
            ROW_HEIGHT - 4.0
        );
        for op in sim.ops.iter().filter(|o| o.device == device) {
            let x = LABEL_WIDTH + op.start_secs * scale;
            let w = ((op.end_secs - op.start_secs) * scale).max(0.5);
            let (colour, letter) = match op.kind {
                OpKind::Forward => (FORWARD_COLOUR, 'F'),
                OpKind::Backward => (BACKWARD_COLOUR, 'B'),
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
    let legend_y = height - 10.0;
    let _ = writeln!(
        svg,
        r##"<text x="4" y="{legend_y}"><tspan fill="{FORWARD_COLOUR}">■ forward</tspan>  <tspan fill="{BACKWARD_COLOUR}">■ backward</tspan>  <tspan fill="#999">■ idle (waiting for a transfer or a dependency)</tspan></text>"##
    );
    svg.push_str("</svg>\n");
    svg
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
        let svg = timeline_svg(&sim, "3 stages <1F1B>");
        assert_eq!(svg.matches(r#"class="row""#).count(), 3);
        assert_eq!(
            svg.matches("<rect").count(),
            svg.matches("</rect>").count() + 3
        );
        assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
        assert!(svg.contains("&lt;1F1B&gt;") && svg.ends_with("</svg>\n"));
    }
}
