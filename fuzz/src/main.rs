//! A mutational fuzzer for pipecut's parsers, on stable Rust.
//!
//! ```text
//! pipecut-fuzz run TARGET SECONDS [--seed N] [--timeout-ms MS]
//! pipecut-fuzz replay TARGET FILE...
//! ```
//!
//! Targets (see `targets.rs`): `onnx` (load, shape inference, cost, partition), `plan` (parse
//! and check against mlp.onnx), `cluster` (the three cluster descriptions), `device` (device and
//! link profiles), `capi` (a config JSON through the C ABI's `pipecut_plan_json`, whose plan must
//! pass `check`), `export` (a model loaded from a scratch folder with data files beside it, cut in
//! two and exported: nothing outside the output folder may change, no link or temporary may stay).
//! Seeds come from the repository's fixtures and malformed corpus. Each input is
//! a seed with one to four mutations (bytes, protobuf fields, JSON values); an input that stops
//! at a new place (phase and error kind) joins the pool, a poor man's coverage signal.
//!
//! Findings go to `fuzz/artifacts/TARGET/`: a panic is caught and saved with its message, and
//! fuzzing goes on; an input that runs past `--timeout-ms`, asks for one allocation over
//! `PIPECUT_FUZZ_ALLOC_LIMIT_MB` (default 1024), or kills the process (stack overflow) is kept in
//! a memory-mapped file and saved by the next start, which `run.sh` does.

mod mutate;
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memmap2::MmapMut;
use mutate::Rng;

/// Refuses (by aborting) any single allocation over the limit: a parser that sizes a buffer
/// from a number in its input is a finding even when the machine could satisfy it.
struct AllocationGuard;

static ALLOC_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

fn over_limit() -> ! {
    // No allocation here: write to the unbuffered stderr and abort.
    let _ = std::io::stderr().write_all(b"pipecut-fuzz: an allocation exceeded the limit\n");
    std::process::abort()
}

// SAFETY: every call is forwarded to the system allocator unchanged, after a size check.
unsafe impl GlobalAlloc for AllocationGuard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT.load(Ordering::Relaxed) {
            over_limit();
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT.load(Ordering::Relaxed) {
            over_limit();
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT.load(Ordering::Relaxed) {
            over_limit();
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: AllocationGuard = AllocationGuard;

/// Largest input kept; mutations that grow an input past it are cut.
const MAX_INPUT: usize = 4 << 20;

thread_local! {
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
    /// Whether the thread is running a target (where panics are findings, recorded quietly).
    static IN_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Milliseconds since the epoch when the running input started; 0 between inputs.
static RUNNING_SINCE_MS: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fuzz/ is inside the repository")
        .to_path_buf()
}

fn files_in(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter(|p| keep(&p.file_name().unwrap_or_default().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The seed inputs of a target: fixtures, the malformed corpus, past findings and the pool
/// saved by earlier runs.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let root = repo_root();
    let mut paths = Vec::new();
    let mut inline: Vec<&str> = Vec::new();
    match target {
        "onnx" | "export" => {
            paths.extend(files_in(&root.join("fixtures/models"), |n| {
                n.ends_with(".onnx")
            }));
            paths.extend(files_in(&root.join("tests/malformed"), |n| {
                n.ends_with(".onnx")
            }));
        }
        "plan" => paths.extend(files_in(&root.join("tests/malformed/plans"), |n| {
            n.ends_with(".json")
        })),
        "cluster" => {
            paths.extend(files_in(&root.join("tests/malformed/clusters"), |n| {
                !n.starts_with("device_") && n.ends_with(".json")
            }));
            inline.extend([
                "2x8xH100-SXM",
                "1x4xL4",
                "4xA100-80GB",
                "H100",
                "A100-80GB,A100-80GB,L4,L4",
                "MI300X,MI300X",
                r#"{"nodes":[{"devices":["H100-SXM","H100-SXM"],"intra_node_link":"NVLink4"},{"devices":["L4"]}],"inter_node_link":"InfiniBand-NDR"}"#,
            ]);
        }
        "device" => {
            for kind in ["devices", "links"] {
                paths.extend(files_in(&root.join("cost-models").join(kind), |n| {
                    n.ends_with(".json")
                }));
            }
            paths.extend(files_in(&root.join("tests/malformed/clusters"), |n| {
                n.starts_with("device_")
            }));
        }
        "capi" => inline.extend([
            r#"{"cluster": "1x2xH100-SXM", "dims": {"batch": 8}}"#,
            r#"{"devices": "A100-80GB,L4", "dims": {"batch": 4}, "stages": 2, "solver": "milp"}"#,
            r#"{"cluster": "1x4xL4", "dims": {"batch": 8}, "stages": "auto", "mode": "training", "schedule": "gpipe", "microbatches": 16}"#,
            r#"{"devices": "H100-SXM,H100-SXM", "dims": {"batch": 8}, "stages": 2, "microbatches": 4294967295}"#,
            r#"{"devices": "H100-SXM,H100-SXM", "dims": {"batch": 8}, "stages": 2, "node_secs": {"/layers/layers.0/Gemm": 1e308, "/layers/layers.2/Gemm": 1e308, "/layers/layers.4/Gemm": 1e308, "/layers/layers.6/Gemm": 1e308}}"#,
            r#"{"cluster": "2x2xH100-SXM", "intra_link": "NVLink4", "inter_link": "InfiniBand-NDR", "dims": {"batch": 2}, "memory_headroom": 0.5, "unknown_op_cost": "bytes", "record_solve_time": true}"#,
        ]),
        _ => {}
    }
    for dir in ["fuzz/regressions", "fuzz/corpus"] {
        paths.extend(files_in(&root.join(dir).join(target), |_| true));
    }
    let mut seeds: Vec<Vec<u8>> = paths
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter(|b| b.len() <= MAX_INPUT)
        .collect();
    seeds.extend(inline.iter().map(|s| s.as_bytes().to_vec()));
    seeds
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The input being run, in a file mapped into memory: if the process dies mid-input (abort,
/// stack overflow, the watchdog), the next start finds the flag set and saves the input.
struct CurrentInput {
    map: MmapMut,
}

impl CurrentInput {
    const HEADER: usize = 9;

    fn open(path: &Path) -> CurrentInput {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .expect("the artifacts folder is writable");
        file.set_len((Self::HEADER + MAX_INPUT) as u64).unwrap();
        // SAFETY: the file is private to this fuzzer process (one per target at a time).
        let map = unsafe { MmapMut::map_mut(&file) }.expect("mmap");
        CurrentInput { map }
    }

    /// The input a previous process died on, if any.
    fn take_dead(&mut self) -> Option<Vec<u8>> {
        if self.map[0] != 1 {
            return None;
        }
        let len = u64::from_le_bytes(self.map[1..9].try_into().unwrap()) as usize;
        self.map[0] = 0;
        Some(self.map[Self::HEADER..Self::HEADER + len.min(MAX_INPUT)].to_vec())
    }

    fn start(&mut self, input: &[u8]) {
        self.map[1..9].copy_from_slice(&(input.len() as u64).to_le_bytes());
        self.map[Self::HEADER..Self::HEADER + input.len()].copy_from_slice(input);
        self.map[0] = 1;
    }

    fn finish(&mut self) {
        self.map[0] = 0;
    }
}

fn save_finding(dir: &Path, kind: &str, input: &[u8], message: &str) -> PathBuf {
    let path = dir.join(format!("{kind}-{:016x}", fnv(input)));
    std::fs::write(&path, input).expect("write the finding");
    std::fs::write(path.with_extension("txt"), message).expect("write the finding's message");
    path
}

struct Options {
    seed: u64,
    timeout: Duration,
}

fn run(target: &str, seconds: u64, options: Options) -> Result<(), String> {
    let root = repo_root();
    let artifacts = root.join("fuzz/artifacts").join(target);
    let pool_dir = root.join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&artifacts).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&pool_dir).map_err(|e| e.to_string())?;

    let mut current = CurrentInput::open(&artifacts.join("current.input"));
    if let Some(dead) = current.take_dead() {
        let path = save_finding(
            &artifacts,
            "died",
            &dead,
            "the process died on this input (abort, allocation over the limit, stack overflow or timeout)",
        );
        println!(
            "{target}: the previous run died on an input, saved as {}",
            path.display()
        );
    }

    let mlp = std::fs::read(root.join("fixtures/models/mlp.onnx")).map_err(|e| e.to_string())?;
    let fixtures = targets::Fixtures::new(&mlp);
    let mut pool = seeds(target);
    if pool.is_empty() {
        return Err(format!("no seeds for target '{target}'"));
    }
    let mut proto_words: Vec<Vec<u8>> = Vec::new();
    let mut json_words: Vec<String> = Vec::new();
    for seed in &pool {
        mutate::harvest_strings(seed, &mut proto_words);
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(seed) {
            mutate::harvest_json(&doc, &mut json_words);
        }
    }

    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if IN_TARGET.with(|t| t.get()) {
            LAST_PANIC.with(|p| *p.borrow_mut() = info.to_string());
        } else {
            // A bug in the fuzzer itself: say so as usual.
            default_hook(info);
        }
    }));
    let limit_mb: usize = std::env::var("PIPECUT_FUZZ_ALLOC_LIMIT_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    ALLOC_LIMIT.store(limit_mb << 20, Ordering::Relaxed);
    let timeout_ms = options.timeout.as_millis() as u64;
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(50));
        let since = RUNNING_SINCE_MS.load(Ordering::Relaxed);
        if since != 0 && now_ms().saturating_sub(since) > timeout_ms {
            let _ = writeln!(
                std::io::stderr(),
                "pipecut-fuzz: an input ran longer than {timeout_ms} ms; exiting so the next start saves it"
            );
            std::process::exit(70);
        }
    });

    let mut rng = Rng::new(options.seed ^ fnv(target.as_bytes()));
    let mut outcomes: BTreeSet<String> = BTreeSet::new();
    let mut crash_sites: BTreeSet<String> = BTreeSet::new();
    let (mut executions, mut crashes) = (0u64, 0u64);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut next_report = started + Duration::from_secs(10);

    let mut execute = |input: &[u8],
                       executions: &mut u64,
                       crashes: &mut u64,
                       current: &mut CurrentInput|
     -> Option<String> {
        current.start(input);
        RUNNING_SINCE_MS.store(now_ms(), Ordering::Relaxed);
        IN_TARGET.with(|t| t.set(true));
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fixtures.run(target, input)));
        IN_TARGET.with(|t| t.set(false));
        RUNNING_SINCE_MS.store(0, Ordering::Relaxed);
        current.finish();
        *executions += 1;
        match result {
            Ok(outcome) => Some(outcome),
            Err(_) => {
                *crashes += 1;
                let message = LAST_PANIC.with(|p| p.borrow().clone());
                // One finding per panic site: the message's location line.
                let site = message.lines().next().unwrap_or_default().to_string();
                if crash_sites.insert(site) {
                    let path = save_finding(&artifacts, "crash", input, &message);
                    println!(
                        "{target}: CRASH {message}\n  input saved as {}",
                        path.display()
                    );
                }
                None
            }
        }
    };

    for seed in pool.clone() {
        if let Some(outcome) = execute(&seed, &mut executions, &mut crashes, &mut current) {
            outcomes.extend(outcome.split(" | ").map(str::to_string));
        }
    }
    let seed_count = pool.len();
    let mut added = 0usize;
    while Instant::now() < deadline {
        // Newer pool entries reached new places; pick them a little more often.
        let parent = if pool.len() > seed_count && rng.chance(3) {
            &pool[seed_count + rng.below(pool.len() - seed_count)]
        } else {
            &pool[rng.below(pool.len())]
        };
        let mut child = parent.clone();
        for _ in 0..1 + rng.below(4) {
            let structured = if rng.chance(2) {
                match target {
                    "onnx" => mutate::mutate_protobuf(&child, &mut rng, &proto_words),
                    _ => mutate::mutate_json(&child, &mut rng, &json_words),
                }
            } else {
                None
            };
            match structured {
                Some(mutated) => child = mutated,
                None => {
                    let other = pool[rng.below(pool.len())].clone();
                    mutate::mutate_bytes(&mut child, &mut rng, &[other], MAX_INPUT);
                }
            }
        }
        child.truncate(MAX_INPUT);
        if let Some(outcome) = execute(&child, &mut executions, &mut crashes, &mut current) {
            // The cluster target reports one outcome per parser: new if any part is new.
            let mut new = false;
            for part in outcome.split(" | ") {
                new |= outcomes.insert(part.to_string());
            }
            if new && pool.len() < 8192 {
                if child.len() <= 64 << 10 {
                    let _ = std::fs::write(pool_dir.join(format!("{:016x}", fnv(&child))), &child);
                }
                pool.push(child);
                added += 1;
            }
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(30);
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{target}: {executions} executions in {secs:.0} s ({:.0}/s), {} outcomes, {crashes} panics",
                executions as f64 / secs,
                outcomes.len()
            );
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "{target}: done: {executions} executions in {secs:.1} s ({:.0}/s), {} distinct outcomes, {added} inputs added to the pool, {crashes} panics at {} sites",
        executions as f64 / secs,
        outcomes.len(),
        crash_sites.len()
    );
    let mut stats = OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("fuzz/artifacts/stats.jsonl"))
        .map_err(|e| e.to_string())?;
    writeln!(
        stats,
        "{}",
        serde_json::json!({
            "target": target, "executions": executions, "seconds": secs,
            "outcomes": outcomes.len(), "panics": crashes, "panic_sites": crash_sites.len(),
        })
    )
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs saved inputs once each; fails if any panics.
fn replay(target: &str, files: &[String]) -> Result<(), String> {
    let mlp =
        std::fs::read(repo_root().join("fixtures/models/mlp.onnx")).map_err(|e| e.to_string())?;
    let fixtures = targets::Fixtures::new(&mlp);
    let mut panicked = 0;
    for file in files {
        let input = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        let started = Instant::now();
        match std::panic::catch_unwind(|| fixtures.run(target, &input)) {
            Ok(outcome) => println!("{file}: {outcome} ({:?})", started.elapsed()),
            Err(_) => {
                println!("{file}: PANIC");
                panicked += 1;
            }
        }
    }
    match panicked {
        0 => Ok(()),
        n => Err(format!("{n} of {} inputs panicked", files.len())),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: pipecut-fuzz run TARGET SECONDS [--seed N] [--timeout-ms MS]\n       pipecut-fuzz replay TARGET FILE...\ntargets: onnx plan cluster device capi export";
    let result = match args.first().map(String::as_str) {
        Some("run") if args.len() >= 3 => {
            let mut options = Options {
                seed: now_ms(),
                timeout: Duration::from_secs(5),
            };
            let mut rest = args[3..].iter();
            while let Some(flag) = rest.next() {
                let value = rest.next().and_then(|v| v.parse::<u64>().ok());
                match (flag.as_str(), value) {
                    ("--seed", Some(v)) => options.seed = v,
                    ("--timeout-ms", Some(v)) => options.timeout = Duration::from_millis(v),
                    _ => {
                        eprintln!("{usage}");
                        std::process::exit(2);
                    }
                }
            }
            match args[2].parse::<u64>() {
                Ok(seconds) if targets::TARGETS.contains(&args[1].as_str()) => {
                    run(&args[1], seconds, options)
                }
                _ => Err(usage.to_string()),
            }
        }
        Some("replay") if args.len() >= 3 => replay(&args[1], &args[2..]),
        _ => Err(usage.to_string()),
    };
    if let Err(message) = result {
        eprintln!("{message}");
        std::process::exit(1);
    }
}
