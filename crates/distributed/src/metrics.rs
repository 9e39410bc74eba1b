//! A rank's running figures, readable while the job runs: in the Prometheus text exposition
//! format (version 0.0.4), served over HTTP at `/metrics` on a loopback port or rewritten to a
//! file every second, so the Prometheus and Grafana set-ups clusters already run can watch a
//! pipeline without anything new. Names follow the format's conventions: a counter ends in
//! `_total`, a unit is spelled out before it (`_seconds_total`, `_bytes_total`), and no gauge
//! ends in `_total`.
//!
//! The endpoint is a small HTTP/1.1 server of its own rather than a crate's: `tiny_http` gives
//! every connection a thread with no limit on their number and no time limit on the request,
//! and `hyper` brings an async runtime for one page. Here each scrape gets a thread, at most
//! [`MAX_CONCURRENT_SCRAPES`] at once, and a client has [`REQUEST_TIMEOUT`] to send at most
//! [`MAX_REQUEST_HEAD_BYTES`] of request head: idle or slow clients delay nobody else, and what
//! they can hold is bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

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
                "microbatches_done_total",
                "counter",
                "Micro-batches this rank has finished.",
                self.microbatches_done as f64,
            ),
            (
                "microbatches_planned",
                "gauge",
                "Micro-batches this rank runs in the job.",
                self.microbatches_total as f64,
            ),
            (
                "busy_seconds_total",
                "counter",
                "Seconds computing the stage.",
                self.busy_secs,
            ),
            (
                "cpu_seconds_total",
                "counter",
                "CPU seconds of the rank's thread while computing.",
                self.cpu_secs,
            ),
            (
                "idle_seconds_total",
                "counter",
                "Seconds not computing (waiting, transferring, fill and drain).",
                self.idle_secs(),
            ),
            (
                "wait_seconds_total",
                "counter",
                "Seconds blocked on the previous stage.",
                self.wait_secs,
            ),
            (
                "transfer_seconds_total",
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
                "sent_bytes_total",
                "counter",
                "Bytes sent to other ranks.",
                self.bytes_sent as f64,
            ),
            (
                "received_bytes_total",
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

/// Most scrapes answered at once. A connection beyond them is answered 503 and closed, so
/// clients that connect and say nothing hold at most this many threads, each for at most
/// [`REQUEST_TIMEOUT`]; Prometheus itself scrapes a target one request at a time.
pub const MAX_CONCURRENT_SCRAPES: usize = 32;

/// How long a client has to send its whole request head: long enough for any scraper on a
/// cluster network, short enough that a client trickling bytes frees its thread soon.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Most bytes of request line and headers read (a scrape sends a few hundred).
pub const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;

/// Serves `GET /metrics` (and `HEAD`) at `addr` until the process ends: 404 for any other
/// path, 405 for any other method on it, 503 beyond [`MAX_CONCURRENT_SCRAPES`].
pub fn serve(addr: SocketAddr, figures: SharedFigures) -> Result<SocketAddr, Error> {
    serve_with_limit(addr, figures, MAX_CONCURRENT_SCRAPES)
}

fn serve_with_limit(
    addr: SocketAddr,
    figures: SharedFigures,
    max_concurrent: usize,
) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| Error::Distributed(format!("cannot serve metrics at {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Distributed(e.to_string()))?;
    thread::spawn(move || accept_scrapes(&listener, &figures, max_concurrent));
    Ok(bound)
}

/// The accept loop: one thread per scrape up to `max_concurrent`.
fn accept_scrapes(listener: &TcpListener, figures: &SharedFigures, max_concurrent: usize) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            // Out of descriptors or memory: wait for scrapes to finish rather than spin.
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        if active.fetch_add(1, Ordering::AcqRel) >= max_concurrent {
            active.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            reply(
                stream,
                &Reply::status(503, "Service Unavailable", "too many scrapes at once\n"),
            );
            continue;
        }
        let (figures, done) = (Arc::clone(figures), Arc::clone(&active));
        let spawned = thread::Builder::new()
            .name("pipecut-metrics".into())
            .spawn(move || {
                answer(stream, &figures);
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads one request and answers it; a client too slow or too long gets no answer.
fn answer(mut stream: TcpStream, figures: &SharedFigures) {
    let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
    let Some(head) = read_request_head(&mut stream) else {
        return;
    };
    let request_line = head.lines().next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or("/"),
    );
    reply(stream, &route(method, target, figures));
}

/// The request line and headers, up to the blank line; `None` past the size or time limit.
fn read_request_head(stream: &mut TcpStream) -> Option<String> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.checked_duration_since(Instant::now())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        let read = stream.read(&mut buffer).ok().filter(|&n| n > 0)?;
        head.extend_from_slice(&buffer[..read]);
        if head.len() > MAX_REQUEST_HEAD_BYTES {
            return None;
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// An HTTP answer: status, extra headers, body (`None`: a HEAD's, the length still given).
struct Reply {
    status: u16,
    reason: &'static str,
    headers: &'static str,
    body: String,
    send_body: bool,
}

impl Reply {
    fn status(status: u16, reason: &'static str, body: &str) -> Reply {
        Reply {
            status,
            reason,
            headers: "Content-Type: text/plain; charset=utf-8\r\n",
            body: body.to_string(),
            send_body: true,
        }
    }
}

/// What `method` on `target` gets.
fn route(method: &str, target: &str, figures: &SharedFigures) -> Reply {
    let path = target.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        return Reply::status(404, "Not Found", "pipecut serves its figures at /metrics\n");
    }
    if method != "GET" && method != "HEAD" {
        return Reply {
            headers: "Allow: GET, HEAD\r\nContent-Type: text/plain; charset=utf-8\r\n",
            ..Reply::status(405, "Method Not Allowed", "/metrics answers GET and HEAD\n")
        };
    }
    Reply {
        status: 200,
        reason: "OK",
        headers: "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n",
        body: snapshot(figures).prometheus(),
        send_body: method == "GET",
    }
}

fn reply(mut stream: TcpStream, reply: &Reply) {
    let head = format!(
        "HTTP/1.1 {} {}\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status,
        reply.reason,
        reply.headers,
        reply.body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if reply.send_body {
        let _ = stream.write_all(reply.body.as_bytes());
    }
    // Closing with unread request bytes would reset the connection and lose the answer: say
    // the answer is whole, then take (briefly, boundedly) what the client still sends.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut rest = [0u8; 1024];
    for _ in 0..MAX_REQUEST_HEAD_BYTES / rest.len() {
        if !matches!(stream.read(&mut rest), Ok(n) if n > 0) {
            break;
        }
    }
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
        assert!(text
            .contains("pipecut_microbatches_done_total{rank=\"3\",stage=\"1\",replica=\"1\"} 2\n"));
        assert!(text.contains("pipecut_bubble_ratio{rank=\"3\",stage=\"1\",replica=\"1\"} 0.25\n"));
        assert!(text.contains("# TYPE pipecut_sent_bytes_total counter\n"));
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
        assert!(reply
            .contains("pipecut_microbatches_done_total{rank=\"0\",stage=\"0\",replica=\"0\"} 7"));
    }

    /// The exposition format's conventions: counters end in `_total`, nothing else does.
    #[test]
    fn counters_and_only_counters_end_in_total() {
        let text = RankFigures::default().prometheus();
        let types: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        assert_eq!(types.len(), 11);
        for (name, kind) in types {
            assert_eq!(
                name.ends_with("_total"),
                kind == "counter",
                "{name} is a {kind}"
            );
        }
    }

    fn scrape(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn other_paths_are_404_and_other_methods_405() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::default()).unwrap();
        let not_found = scrape(addr, "GET /plan.json HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(not_found.starts_with("HTTP/1.1 404 "), "{not_found}");
        let post = scrape(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
        let head = scrape(addr, "HEAD /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let garbage = scrape(addr, "\u{0}\u{1} nonsense\r\n\r\n");
        assert!(garbage.starts_with("HTTP/1.1 404 "), "{garbage}");
    }

    /// Clients that connect and say nothing do not hold up a scrape: it is answered while they
    /// are all still connected and unanswered.
    #[test]
    fn idle_connections_do_not_delay_a_scrape() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::default()).unwrap();
        let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let reply = scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        for mut stream in idle {
            stream.set_nonblocking(true).unwrap();
            let mut byte = [0u8; 1];
            let pending = stream.read(&mut byte).unwrap_err().kind();
            assert_eq!(
                pending,
                std::io::ErrorKind::WouldBlock,
                "an idle client was answered"
            );
        }
    }

    /// Past the limit a client is told so at once, and a slow client is dropped at the timeout,
    /// freeing its place.
    #[test]
    fn scrapes_beyond_the_limit_get_503_until_a_place_frees() {
        let addr = serve_with_limit("127.0.0.1:0".parse().unwrap(), Arc::default(), 2).unwrap();
        let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // The accept loop counts a connection once it takes it: wait until both are taken.
        let mut reply = String::new();
        for _ in 0..50 {
            reply = scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n");
            if reply.starts_with("HTTP/1.1 503 ") {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        assert!(reply.starts_with("HTTP/1.1 503 "), "{reply}");
        // A client that never finishes its request is closed at REQUEST_TIMEOUT, unanswered.
        let mut slow = idle.into_iter().next().unwrap();
        slow.write_all(b"GET /metr").unwrap();
        let mut rest = Vec::new();
        slow.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
        // Its place frees as its thread ends, a moment after the client sees the close.
        let mut after = String::new();
        for _ in 0..50 {
            after = scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n");
            if after.starts_with("HTTP/1.1 200 OK") {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        assert!(after.starts_with("HTTP/1.1 200 OK"), "{after}");
    }
}
