//! A rank's running figures, readable while the job runs: in the Prometheus text exposition
//! format (version 0.0.4), served over HTTP at `/metrics` on a loopback port or rewritten to a
//! file every second, so the Prometheus and Grafana set-ups clusters already run can watch a
//! pipeline without anything new.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde::Serialize;

use crate::Error;

/// What one rank has done so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RankFigures {
    /// The rank.
    pub rank: usize,
    /// Its pipeline stage.
    pub stage: usize,
    /// Its data-parallel replica.
    pub replica: usize,
    /// Micro-batches this rank runs in the job.
    pub microbatches_total: usize,
    /// Micro-batches it has finished.
    pub microbatches_done: usize,
    /// Seconds computing its stage.
    pub busy_secs: f64,
    /// CPU seconds of the rank's thread while it computed (the scheduler's account: unlike
    /// `busy_secs`, it leaves out time other processes held the core; 0 where the platform
    /// cannot tell). Threads a kernel starts itself are not counted.
    pub cpu_secs: f64,
    /// Seconds blocked waiting for the previous stage's next message.
    pub wait_secs: f64,
    /// Seconds encoding, sending and decoding messages.
    pub transfer_secs: f64,
    /// Seconds since the rank's first micro-batch could start.
    pub wall_secs: f64,
    /// Bytes this rank sent.
    pub bytes_sent: u64,
    /// Bytes this rank received.
    pub bytes_received: u64,
    /// Messages from the previous stage that have arrived and wait to be computed.
    pub queue_depth: usize,
}

impl RankFigures {
    /// Seconds not spent computing.
    pub fn idle_secs(&self) -> f64 {
        (self.wall_secs - self.busy_secs).max(0.0)
    }

    /// The fraction of the wall time not spent computing.
    pub fn bubble(&self) -> f64 {
        if self.wall_secs > 0.0 {
            self.idle_secs() / self.wall_secs
        } else {
            0.0
        }
    }

    /// The figures in the Prometheus text format, labelled by rank, stage and replica.
    pub fn prometheus(&self) -> String {
        let labels = format!(
            "rank=\"{}\",stage=\"{}\",replica=\"{}\"",
            self.rank, self.stage, self.replica
        );
        let series: [(&str, &str, &str, f64); 11] = [
            (
                "microbatches_done",
                "counter",
                "Micro-batches this rank has finished.",
                self.microbatches_done as f64,
            ),
            (
                "microbatches_total",
                "gauge",
                "Micro-batches this rank runs in the job.",
                self.microbatches_total as f64,
            ),
            (
                "busy_seconds",
                "counter",
                "Seconds computing the stage.",
                self.busy_secs,
            ),
            (
                "cpu_seconds",
                "counter",
                "CPU seconds of the rank's thread while computing.",
                self.cpu_secs,
            ),
            (
                "idle_seconds",
                "counter",
                "Seconds not computing (waiting, transferring, fill and drain).",
                self.idle_secs(),
            ),
            (
                "wait_seconds",
                "counter",
                "Seconds blocked on the previous stage.",
                self.wait_secs,
            ),
            (
                "transfer_seconds",
                "counter",
                "Seconds encoding, sending and decoding messages.",
                self.transfer_secs,
            ),
            (
                "bubble_ratio",
                "gauge",
                "Fraction of the wall time not spent computing.",
                self.bubble(),
            ),
            (
                "sent_bytes",
                "counter",
                "Bytes sent to other ranks.",
                self.bytes_sent as f64,
            ),
            (
                "received_bytes",
                "counter",
                "Bytes received from other ranks.",
                self.bytes_received as f64,
            ),
            (
                "queue_depth",
                "gauge",
                "Messages from the previous stage waiting to be computed.",
                self.queue_depth as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in series {
            out.push_str(&format!(
                "# HELP pipecut_{name} {help}\n# TYPE pipecut_{name} {kind}\npipecut_{name}{{{labels}}} {value}\n"
            ));
        }
        out
    }
}

/// The figures, shared between the rank's loop and whoever publishes them.
pub type SharedFigures = Arc<Mutex<RankFigures>>;

fn snapshot(figures: &SharedFigures) -> RankFigures {
    figures.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Serves `GET /metrics` (any path, in fact) at `addr` until the process ends.
pub fn serve(addr: SocketAddr, figures: SharedFigures) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| Error::Distributed(format!("cannot serve metrics at {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Distributed(e.to_string()))?;
    thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
            // The request itself does not matter; read what came so the client sees a reply.
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let body = snapshot(&figures).prometheus();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(bound)
}

/// Rewrites `path` with the figures every second until the process ends; the caller writes it
/// once more at the end ([`write_file`]).
pub fn publish_to_file(path: PathBuf, figures: SharedFigures) {
    thread::spawn(move || loop {
        let _ = write_file(&path, &snapshot(&figures));
        thread::sleep(Duration::from_secs(1));
    });
}

/// Writes the figures to `path`, replacing it whole (a scraper never sees half a file).
pub fn write_file(path: &Path, figures: &RankFigures) -> Result<(), Error> {
    pipecut_ir::io::write_atomically(
        path,
        figures.prometheus().as_bytes(),
        pipecut_ir::io::OutputMode::Default,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_has_help_type_and_labels() {
        let figures = RankFigures {
            rank: 3,
            stage: 1,
            replica: 1,
            microbatches_total: 4,
            microbatches_done: 2,
            busy_secs: 1.5,
            wall_secs: 2.0,
            bytes_sent: 1024,
            ..RankFigures::default()
        };
        let text = figures.prometheus();
        assert!(
            text.contains("pipecut_microbatches_done{rank=\"3\",stage=\"1\",replica=\"1\"} 2\n")
        );
        assert!(text.contains("pipecut_bubble_ratio{rank=\"3\",stage=\"1\",replica=\"1\"} 0.25\n"));
        assert!(text.contains("# TYPE pipecut_sent_bytes counter\n"));
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(
            samples,
            text.lines().filter(|l| l.starts_with("# TYPE")).count()
        );
    }

    #[test]
    fn the_endpoint_answers_an_http_scrape() {
        let figures: SharedFigures = Arc::default();
        figures.lock().unwrap().microbatches_done = 7;
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&figures)).unwrap();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.contains("pipecut_microbatches_done{rank=\"0\",stage=\"0\",replica=\"0\"} 7"));
    }
}
