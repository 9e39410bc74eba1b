//! The progress display of the commands that solve: elapsed time and, while the MILP searches,
//! its best bottleneck, bound and gap. On a terminal a spinner line on stderr; when stderr is
//! piped or redirected, plain lines (at most one every [`LINE_INTERVAL`], none before it), so a
//! long solve in CI or a log still says what it is doing.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::partition::{Progress, SolverKind};

/// Plain lines come at most this often (and the first after this long): a solve that finishes
/// within a second prints nothing, a ten-second one about ten lines.
const LINE_INTERVAL: Duration = Duration::from_secs(1);

/// A running progress display; [`Display::finish`] clears or ends it.
pub(crate) struct Display {
    label: String,
    started: Instant,
    bar: Option<indicatif::ProgressBar>,
    last_line: Mutex<Instant>,
    last_report: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Display {
    /// Starts a display for work described by `label`; a heartbeat says the elapsed time when
    /// nothing else has been reported for a while (the cluster search reports nothing else).
    pub(crate) fn start(label: &str) -> Arc<Display> {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner().with_message(label.to_string());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        let display = Arc::new(Display {
            label: label.to_string(),
            started: Instant::now(),
            bar,
            last_line: Mutex::new(Instant::now()),
            last_report: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let heartbeat = Arc::clone(&display);
        std::thread::spawn(move || {
            while !heartbeat.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                heartbeat.show(None);
            }
        });
        display
    }

    /// Reports a solver's progress.
    pub(crate) fn report(&self, progress: &Progress) {
        self.show(Some(describe(progress)));
    }

    fn show(&self, report: Option<String>) {
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        let mut last_report = self.last_report.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(report) = report {
            *last_report = Some(report);
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let text = match last_report.as_deref() {
            Some(report) => format!("{} — {elapsed:.1} s — {report}", self.label),
            None => format!("{} — {elapsed:.1} s", self.label),
        };
        match &self.bar {
            Some(bar) => bar.set_message(text),
            None => {
                let mut last_line = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
                if last_line.elapsed() >= LINE_INTERVAL {
                    *last_line = Instant::now();
                    // A closed stderr is not worth failing the solve for.
                    let _ = writeln!(std::io::stderr().lock(), "pipecut: {text}");
                }
            }
        }
    }

    /// Stops the display: clears the spinner, stops the heartbeat.
    pub(crate) fn finish(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// "MILP, 4 stages: best 0.163 ms, bound 0.160 ms, gap 1.84%".
pub(crate) fn describe(progress: &Progress) -> String {
    let solver = match progress.solver {
        SolverKind::Dp => "DP",
        SolverKind::Milp => "MILP",
        SolverKind::IdealSearch => "ideal search",
    };
    let stages = crate::onnx::inspect::count_of(progress.stages, "stage");
    let best = format!("best {:.3} ms", progress.best_secs * 1e3);
    match (progress.bound_secs, progress.gap()) {
        (Some(bound), Some(gap)) => format!(
            "{solver}, {stages}: {best}, bound {:.3} ms, gap {:.2}%",
            bound * 1e3,
            gap * 100.0
        ),
        _ => format!("{solver}, {stages}: {best} (no bound yet)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_the_solver_the_best_the_bound_and_the_gap() {
        let progress = Progress {
            elapsed_secs: 2.0,
            solver: SolverKind::Milp,
            stages: 4,
            best_secs: 0.2e-3,
            bound_secs: Some(0.19e-3),
        };
        assert_eq!(
            describe(&progress),
            "MILP, 4 stages: best 0.200 ms, bound 0.190 ms, gap 5.00%"
        );
        let coarse = Progress {
            bound_secs: None,
            stages: 1,
            ..progress
        };
        assert_eq!(
            describe(&coarse),
            "MILP, 1 stage: best 0.200 ms (no bound yet)"
        );
    }
}
