//! Multi-process runs (`pipecut run --distributed`): ranks started as a launcher starts them
//! give outputs bit-for-bit equal to the one-process run, a killed or missing rank ends the
//! job with an error naming it, and a rank's metrics can be scraped while it runs. Ranks talk
//! over TCP here (the default build); with `--features mpi` the same job runs under `mpirun`,
//! and with `--features cuda` GPU ranks run over NCCL on a fake 4-GPU machine (the fake driver,
//! cuBLAS and NCCL of `tests/fake_cuda/`, built with g++).

mod common;
#[cfg(feature = "cuda")]
mod fake_cuda;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn pipecut() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pipecut"));
    command.current_dir(common::root());
    command
}

fn run_ok(command: &mut Command) -> Output {
    let out = command.output().expect("pipecut runs");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `pipecut export PLAN MODEL --out-dir OUT`, which must succeed.
fn export_stages(
    plan: impl AsRef<std::ffi::OsStr>,
    model: impl AsRef<std::ffi::OsStr>,
    out: &Path,
) {
    run_ok(
        pipecut()
            .arg("export")
            .arg(plan)
            .arg(model)
            .arg("--out-dir")
            .arg(out),
    );
}

/// A port for a rank to listen on, free when asked. Taken below Linux's ephemeral range
/// (32768 on), where neither a port the system picks (`bind` to port 0) nor the local end of
/// a connection made meanwhile by a test beside this one can land; each test process starts
/// at its own place and never gives the same port twice, so two at once rarely meet.
fn free_port() -> u16 {
    free_ports(1).0
}

/// A `MASTER_PORT` for torchrun whose next port is free too, the next one held by the
/// listener given: under torchrun rank 0 listens on a port the system picks and publishes it
/// in the agent's store (crates/distributed/src/launch.rs), where it once took the port after
/// `MASTER_PORT`, which a CI run (2026-12-07) found already in use.
fn free_port_and_the_next_held() -> (u16, TcpListener) {
    let (port, mut held) = free_ports(2);
    (port, held.pop().expect("the second port"))
}

/// `count` consecutive ports, free when asked; gives the first, and listeners holding all but
/// the first (which the caller's process must be able to bind).
fn free_ports(count: u16) -> (u16, Vec<TcpListener>) {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = std::process::id() % u32::from(SPAN);
    for _ in 0..SPAN {
        let next = u32::from(NEXT.fetch_add(count, Ordering::SeqCst));
        let port = LOW + ((start + next) % u32::from(SPAN - count)) as u16;
        let held: Option<Vec<TcpListener>> = (port..port + count)
            .map(|p| TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if let Some(mut held) = held {
            held.remove(0);
            return (port, held);
        }
    }
    panic!(
        "{count} free consecutive ports between {LOW} and {}",
        LOW + SPAN
    )
}

/// The fixture's dims other than the batch, as `--dim` arguments.
fn dims_without_batch(name: &str) -> Vec<String> {
    common::fixture_reference(name)
        .dims
        .iter()
        .filter(|(dim, _)| dim != "batch")
        .flat_map(|(dim, v)| ["--dim".to_string(), format!("{dim}={v}")])
        .collect()
}

/// Starts `world` ranks of `pipecut run PLAN MODEL --distributed ARGS` the way torchrun
/// does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
fn start_ranks(world: usize, ranks: &[usize], args: &[String]) -> Vec<(usize, Child)> {
    start_ranks_with(world, ranks, args, &[])
}

/// [`start_ranks`] with `env` added to every rank's environment.
fn start_ranks_with(
    world: usize,
    ranks: &[usize],
    args: &[String],
    env: &[(String, String)],
) -> Vec<(usize, Child)> {
    start_ranks_at(free_port(), world, ranks, args, env)
}

/// [`start_ranks_with`] meeting at the rendezvous port `port` (so that a job's ranks can be
/// started apart).
fn start_ranks_at(
    port: u16,
    world: usize,
    ranks: &[usize],
    args: &[String],
    env: &[(String, String)],
) -> Vec<(usize, Child)> {
    let port = port.to_string();
    ranks
        .iter()
        .map(|&rank| {
            let child = pipecut()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .args(["run"])
                .args(args)
                .arg("--distributed")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("a rank starts");
            (rank, child)
        })
        .collect()
}

/// Waits for every rank, killing all of them if the job outlives `limit` (a hang is a failure).
fn wait_all(ranks: Vec<(usize, Child)>, limit: Duration) -> Vec<(usize, Output)> {
    let began = Instant::now();
    let mut ranks = ranks;
    while ranks
        .iter_mut()
        .any(|(_, c)| c.try_wait().unwrap().is_none())
    {
        if began.elapsed() > limit {
            for (_, c) in &mut ranks {
                let _ = c.kill();
            }
            panic!("the job hung: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ranks
        .into_iter()
        .map(|(rank, c)| (rank, c.wait_with_output().unwrap()))
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A plan for `name` of 2 stages × 2 replicas on four CPUs (`plan-cluster --pp 2 --dp 2`).
fn two_by_two_plan(dir: &Path, name: &str) -> PathBuf {
    let model = common::fixture(name);
    let out = dir.join(format!("{name}-2x2.json"));
    run_ok(
        pipecut()
            .args(["plan-cluster", model.to_str().unwrap()])
            .args(["--devices", "cpu,cpu,cpu,cpu", "--global-batch", "8"])
            .args(["--pp", "2", "--dp", "2"])
            .args(dims_without_batch(name))
            .arg("--out")
            .arg(&out),
    );
    let plan: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(plan["stages"].as_array().unwrap().len(), 2);
    assert_eq!(plan["parallelism"]["data_parallel"], 2);
    out
}

/// The micro-batches of the plan's whole step: per replica, times the replicas.
fn step_microbatches(plan: &Path) -> usize {
    let plan: Value = serde_json::from_slice(&std::fs::read(plan).unwrap()).unwrap();
    let replicas = plan["parallelism"]["data_parallel"].as_u64().unwrap_or(1);
    (plan["config"]["microbatches"].as_u64().unwrap() * replicas) as usize
}

/// `pipecut run ARGS` in one process for the whole step of `step` micro-batches, writing the
/// outputs into `out` (the reference the ranks' outputs must equal).
fn one_process_run(args: &[String], step: usize, out: &Path) -> PathBuf {
    one_process_run_with(args, step, out, &[])
}

/// [`one_process_run`] with `env` added to its environment.
fn one_process_run_with(
    args: &[String],
    step: usize,
    out: &Path,
    env: &[(String, String)],
) -> PathBuf {
    run_ok(
        pipecut()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("run")
            .args(args)
            .args(["--microbatches", &step.to_string()])
            .arg("--output-dir")
            .arg(out),
    );
    out.to_path_buf()
}

/// Every output file of two runs is byte-for-byte the same.
fn assert_same_outputs(single: &Path, multi: &Path, what: &str) {
    let mut names: Vec<_> = std::fs::read_dir(single)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert!(
        !names.is_empty(),
        "{what}: the one-process run wrote no outputs"
    );
    for name in names {
        let a = std::fs::read(single.join(&name)).unwrap();
        let b = std::fs::read(multi.join(&name))
            .unwrap_or_else(|e| panic!("{what}: {name:?} not written by the ranks: {e}"));
        assert!(a == b, "{what}: {name:?} differs from the one-process run");
    }
}

#[test]
fn ranks_give_the_one_process_outputs_bit_for_bit_on_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    for name in common::FIXTURES {
        let plan = two_by_two_plan(dir.path(), name);
        let step = step_microbatches(&plan);
        let model = common::fixture(name);
        let args: Vec<String> = vec![
            plan.to_str().unwrap().into(),
            model.to_str().unwrap().into(),
            "--seed".into(),
            "7".into(),
        ];
        let single = one_process_run(&args, step, &dir.path().join(format!("{name}-single")));
        let multi = dir.path().join(format!("{name}-multi"));
        let mut rank_args = args.clone();
        rank_args.extend([
            "--output-dir".into(),
            multi.to_str().unwrap().into(),
            "--json".into(),
        ]);
        rank_args.extend(["--peer-timeout".into(), "60s".into()]);
        let ranks = wait_all(
            start_ranks(4, &[0, 1, 2, 3], &rank_args),
            Duration::from_secs(300),
        );
        for (rank, out) in &ranks {
            assert!(out.status.success(), "{name} rank {rank}: {}", stderr(out));
            let report: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(report["transport"], "tcp");
            assert_eq!(report["rank"], *rank);
            assert_eq!(report["stage"], rank % 2);
            assert_eq!(report["replica"], rank / 2);
            assert_eq!(report["microbatches_done"], step / 2, "{name} rank {rank}");
            assert!(report["busy_secs"].as_f64().unwrap() > 0.0);
            if rank % 2 == 0 {
                assert!(
                    report["bytes_sent"].as_u64().unwrap() > 0,
                    "{name} rank {rank}"
                );
            }
        }
        assert_same_outputs(&single, &multi, &format!("{name} (2 stages x 2 replicas)"));
    }
}

/// A plan for gpt2_tiny of 2 tensor-parallel ranks × 2 stages × `replicas` replicas, with
/// sequence parallelism if asked (`plan-cluster --tp 2 --pp 2`), micro-batches of 2 rows.
fn tensor_parallel_plan(dir: &Path, replicas: usize, sequence_parallel: bool) -> PathBuf {
    let model = common::fixture("gpt2_tiny");
    let out = dir.join(format!("tp-{replicas}-{sequence_parallel}.json"));
    let mut command = pipecut();
    command
        .args(["plan-cluster", model.to_str().unwrap()])
        .args(["--cluster", "2x4xA100-80GB", "--dim", "seq=16"])
        .args(["--global-batch", &(4 * replicas).to_string()])
        .args(["--microbatch-sizes", "2", "--tp", "2", "--pp", "2"])
        .args(["--dp", &replicas.to_string()])
        .arg("--out")
        .arg(&out);
    if sequence_parallel {
        command.arg("--sequence-parallel");
    }
    run_ok(&mut command);
    let plan: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let tp = &plan["parallelism"]["tensor_parallel"];
    assert_eq!(tp["degree"], 2);
    assert_eq!(tp["sequence_parallel"], sequence_parallel);
    assert_eq!(plan["stages"].as_array().unwrap().len(), 2);
    out
}

#[test]
fn tensor_parallel_ranks_as_processes_give_the_one_process_outputs_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::fixture("gpt2_tiny");
    for (replicas, sequence_parallel) in [(1, false), (2, true)] {
        let what =
            format!("gpt2_tiny, t = 2 x 2 stages x {replicas} replica(s), sp {sequence_parallel}");
        let plan = tensor_parallel_plan(dir.path(), replicas, sequence_parallel);
        let step = step_microbatches(&plan);
        let args: Vec<String> = vec![
            plan.to_str().unwrap().into(),
            model.to_str().unwrap().into(),
            "--seed".into(),
            "7".into(),
        ];
        let name = format!("tp-{replicas}");
        let single = one_process_run(&args, step, &dir.path().join(format!("{name}-single")));
        let multi = dir.path().join(format!("{name}-multi"));
        let mut rank_args = args.clone();
        rank_args.extend(["--output-dir".into(), multi.to_str().unwrap().into()]);
        rank_args.extend(["--json".into(), "--peer-timeout".into(), "60s".into()]);
        let world = 4 * replicas;
        let all: Vec<usize> = (0..world).collect();
        let ranks = wait_all(
            start_ranks(world, &all, &rank_args),
            Duration::from_secs(300),
        );
        for (rank, out) in &ranks {
            assert!(out.status.success(), "{what} rank {rank}: {}", stderr(out));
            let report: Value = serde_json::from_slice(&out.stdout).unwrap();
            // The TP rank varies fastest, then the stage, then the replica.
            assert_eq!(report["tp_rank"], rank % 2, "{what} rank {rank}");
            assert_eq!(report["stage"], (rank / 2) % 2, "{what} rank {rank}");
            assert_eq!(report["replica"], rank / 4, "{what} rank {rank}");
            assert_eq!(
                report["microbatches_done"],
                step / replicas,
                "{what} rank {rank}"
            );
            // Only TP rank 0 of the last stage of replica 0 writes the outputs.
            let writes = report["outputs"].as_object().is_some_and(|o| !o.is_empty());
            assert_eq!(writes, *rank == 2, "{what} rank {rank}");
        }
        assert_same_outputs(&single, &multi, &what);
    }
}

#[test]
fn a_killed_tensor_parallel_rank_ends_the_job_with_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let plan = tensor_parallel_plan(dir.path(), 1, false);
    let model = common::fixture("gpt2_tiny");
    let args: Vec<String> = vec![
        plan.to_str().unwrap().into(),
        model.to_str().unwrap().into(),
        "--microbatches".into(),
        "1000".into(),
        "--peer-timeout".into(),
        "60s".into(),
        "--output-dir".into(),
        dir.path().join("out").to_str().unwrap().into(),
    ];
    let mut ranks = start_ranks(4, &[0, 1, 2, 3], &args);
    // Rank 3 is TP rank 1 of the last stage: killed mid-job, its TP peer (rank 2) is waiting
    // for it in a collective or soon will be.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        ranks[3].1.try_wait().unwrap().is_none(),
        "the job ended before rank 3 could be killed mid-way"
    );
    ranks[3].1.kill().unwrap();
    let began = Instant::now();
    let ended = wait_all(ranks, Duration::from_secs(120));
    // Seen at once as a closed connection, not after the 60 s peer timeout.
    assert!(
        began.elapsed() < Duration::from_secs(40),
        "{:?}",
        began.elapsed()
    );
    for (rank, out) in &ended {
        assert!(!out.status.success(), "rank {rank} succeeded");
    }
    let message = stderr(&ended[2].1);
    assert!(
        message.contains("rank 3 (TP rank 1 of stage 1 of replica 0) closed its connection"),
        "{message}"
    );
    assert_eq!(message.trim().lines().count(), 1, "{message}");
}

/// A plan for `name` in four stages on four CPUs: tensors then skip stages, so ranks relay.
fn four_stage_plan(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(format!("{name}-4.json"));
    run_ok(
        pipecut()
            .arg("partition")
            .arg(common::fixture(name))
            .args(["--devices", "cpu,cpu,cpu,cpu", "--stages", "4"])
            .args(["--dim", "batch=2", "--microbatches", "4"])
            .args(dims_without_batch(name))
            .arg("--out")
            .arg(&out),
    );
    out
}

#[test]
fn ranks_loading_only_their_exported_stage_file_give_the_whole_model_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let two_by_two = common::FIXTURES.map(|name| (name, two_by_two_plan(dir.path(), name), 2));
    let four_stages = ["gpt2_tiny", "llama_tiny"].map(|n| (n, four_stage_plan(dir.path(), n), 4));
    for (name, plan, stages) in two_by_two.into_iter().chain(four_stages) {
        let step = step_microbatches(&plan);
        let model = common::fixture(name);
        let export = dir.path().join(format!("{name}-{stages}-stages"));
        export_stages(&plan, &model, &export);
        let seed = ["--seed".to_string(), "5".to_string()];
        let whole: Vec<String> = [plan.to_str().unwrap(), model.to_str().unwrap()]
            .map(String::from)
            .into_iter()
            .chain(seed.clone())
            .collect();
        let single = one_process_run(
            &whole,
            step,
            &dir.path().join(format!("{name}-{stages}-whole")),
        );
        let multi = dir.path().join(format!("{name}-{stages}-exported"));
        let mut rank_args: Vec<String> = vec![
            plan.to_str().unwrap().into(),
            export.to_str().unwrap().into(),
            "--output-dir".into(),
            multi.to_str().unwrap().into(),
            "--json".into(),
        ];
        rank_args.extend(seed);
        let ranks = wait_all(
            start_ranks(4, &[0, 1, 2, 3], &rank_args),
            Duration::from_secs(300),
        );
        for (rank, out) in &ranks {
            assert!(out.status.success(), "{name} rank {rank}: {}", stderr(out));
            let report: Value = serde_json::from_slice(&out.stdout).unwrap();
            let loaded = report["model"].as_str().unwrap();
            assert!(
                loaded.ends_with(&format!("stage_{}.onnx", rank % stages)),
                "{name} rank {rank} loaded {loaded}"
            );
        }
        assert_same_outputs(
            &single,
            &multi,
            &format!("{name} from its export, {stages} ranks"),
        );
    }
    // Without --distributed, or from an export of another plan, the directory is refused.
    let plan = two_by_two_plan(dir.path(), "mlp");
    let export = dir.path().join("gpt2_tiny-2-stages");
    let out = pipecut()
        .arg("run")
        .args([&plan, &export])
        .output()
        .unwrap();
    let message = stderr(&out);
    assert!(message.contains("--distributed"), "{message}");
    // Rank 0 fails before it joins: it waits for the others (the peer timeout at most) to
    // tell them, and none comes.
    let wrong = wait_all(
        start_ranks(
            4,
            &[0],
            &[
                plan.to_str().unwrap().into(),
                export.to_str().unwrap().into(),
                "--peer-timeout".into(),
                "3s".into(),
            ],
        ),
        Duration::from_secs(60),
    );
    let message = stderr(&wrong[0].1);
    assert!(!wrong[0].1.status.success());
    assert!(message.contains("another model file"), "{message}");
}

/// A two-stage gpt2_tiny plan and its arguments for a run of `microbatches`.
fn two_stage_job(dir: &Path, microbatches: usize, timeout: &str) -> Vec<String> {
    let plan = dir.join("gpt2-2.json");
    let model = common::fixture("gpt2_tiny");
    run_ok(
        pipecut()
            .args(["partition", model.to_str().unwrap(), "--devices", "cpu,cpu"])
            .args(["--dim", "batch=2"])
            .args(dims_without_batch("gpt2_tiny"))
            .arg("--out")
            .arg(&plan),
    );
    vec![
        plan.to_str().unwrap().into(),
        model.to_str().unwrap().into(),
        "--microbatches".into(),
        microbatches.to_string(),
        "--peer-timeout".into(),
        timeout.into(),
        "--output-dir".into(),
        dir.join("out").to_str().unwrap().into(),
    ]
}

#[test]
fn a_killed_rank_ends_the_job_with_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let args = two_stage_job(dir.path(), 512, "5s");
    let ranks = start_ranks(2, &[0, 1], &args);
    let message = kill_the_last_stage_after(ranks, Duration::from_millis(1500));
    assert!(
        message.contains("rank 1 (stage 1 of replica 0)"),
        "the error names the lost rank: {message}"
    );
    assert_eq!(message.trim().lines().count(), 1, "{message}");
}

/// Lets a two-rank job run for `settle`, kills rank 1 as an out-of-memory killer would, and
/// returns what rank 0 said: it must fail, within 30 s of the kill.
fn kill_the_last_stage_after(mut ranks: Vec<(usize, Child)>, settle: Duration) -> String {
    std::thread::sleep(settle);
    let (_, victim) = &mut ranks[1];
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the job ended before the kill"
    );
    victim.kill().unwrap();
    let began = Instant::now();
    let outputs = wait_all(ranks, Duration::from_secs(60));
    let (_, survivor) = &outputs[0];
    assert!(!survivor.status.success());
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
    stderr(survivor)
}

#[test]
fn a_rank_that_never_starts_is_named_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let args = two_stage_job(dir.path(), 2, "2s");
    let alone = wait_all(start_ranks(2, &[0], &args), Duration::from_secs(60));
    let message = stderr(&alone[0].1);
    assert!(!alone[0].1.status.success());
    assert!(
        message.contains("rank(s) 1 never joined the rendezvous"),
        "{message}"
    );
    let orphan = wait_all(start_ranks(2, &[1], &args), Duration::from_secs(60));
    let message = stderr(&orphan[0].1);
    assert!(
        message.contains("rank 0 never opened the rendezvous"),
        "{message}"
    );
    let wrong = pipecut()
        .arg("run")
        .args(&args)
        .arg("--distributed")
        .env("RANK", "0")
        .env("WORLD_SIZE", "3")
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        message.contains("= 2 ranks, but torchrun started 3"),
        "{message}"
    );
}

/// Parses one sample of a Prometheus text exposition.
fn sample(text: &str, metric: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The body of a scrape, or `None` while nothing (or something other than a rank) answers:
/// with timeouts, so that another program on the port cannot hang the test.
fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let body = reply.split("\r\n\r\n").nth(1)?;
    body.contains("pipecut_").then(|| body.to_string())
}

/// A port whose successor is free too (rank r serves at the base port + its local rank).
fn two_free_ports() -> u16 {
    free_ports(2).0
}

/// `--metrics-file` is checked like every other output: naming the job's own plan is refused
/// before the job starts, and the plan is left as it was (it was overwritten every second).
#[test]
fn a_metrics_file_naming_the_plan_is_refused_and_the_plan_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = two_stage_job(dir.path(), 2, "10s");
    let plan = std::path::PathBuf::from(&args[0]);
    let before = std::fs::read(&plan).unwrap();
    args.extend(["--metrics-file".into(), args[0].clone()]);
    for (rank, out) in wait_all(start_ranks(2, &[0, 1], &args), Duration::from_secs(60)) {
        assert!(!out.status.success(), "rank {rank} succeeded");
        let message = stderr(&out);
        assert!(message.contains("gpt2-2.json"), "rank {rank}: {message}");
    }
    assert_eq!(
        std::fs::read(&plan).unwrap(),
        before,
        "the plan was overwritten"
    );
}

#[test]
fn metrics_are_scraped_while_the_job_runs_and_written_at_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let microbatches = 48;
    let mut args = two_stage_job(dir.path(), microbatches, "60s");
    let base = two_free_ports();
    let file = dir.path().join("rank-{rank}.prom");
    args.extend([
        "--metrics-addr".into(),
        format!("127.0.0.1:{base}"),
        "--metrics-file".into(),
        file.to_str().unwrap().into(),
    ]);
    let ranks = start_ranks(2, &[0, 1], &args);
    // Rank 1 serves at base + its local rank.
    let mut seen_running = None;
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(120) && seen_running.is_none() {
        if let Some(text) = scrape(base + 1) {
            let done = sample(&text, "pipecut_microbatches_done_total").unwrap();
            assert_eq!(
                sample(&text, "pipecut_microbatches_planned"),
                Some(microbatches as f64)
            );
            if done > 0.0 && done < microbatches as f64 {
                seen_running = Some(text);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let outputs = wait_all(ranks, Duration::from_secs(300));
    for (rank, out) in &outputs {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    let text = seen_running.expect("a scrape saw the job part done");
    assert!(text.contains("# TYPE pipecut_busy_seconds_total counter"));
    assert!(text.contains("stage=\"1\""), "{text}");
    let last = std::fs::read_to_string(dir.path().join("rank-0.prom")).unwrap();
    assert_eq!(
        sample(&last, "pipecut_microbatches_done_total"),
        Some(microbatches as f64)
    );
    assert!(sample(&last, "pipecut_sent_bytes_total").unwrap() > 0.0);
    let bubble = sample(&last, "pipecut_bubble_ratio").unwrap();
    assert!((0.0..1.0).contains(&bubble), "{bubble}");
}

/// `mpirun` as CI runs it: as root where needed, more ranks than cores.
#[cfg(feature = "mpi")]
fn mpirun(world: usize, args: &[String]) -> Option<Command> {
    if Command::new("mpirun").arg("--version").output().is_err() {
        common::skip(
            common::Need::Toolchain,
            "no mpirun: install Open MPI (`apt-get install openmpi-bin libopenmpi-dev`)",
        );
        return None;
    }
    let mut command = Command::new("mpirun");
    command
        .current_dir(common::root())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", &world.to_string()])
        .arg(env!("CARGO_BIN_EXE_pipecut"))
        .arg("run")
        .args(args)
        .args(["--distributed", "--transport", "mpi"]);
    Some(command)
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_ranks_give_the_one_process_outputs_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for name in common::FIXTURES {
        let plan = two_by_two_plan(dir.path(), name);
        let step = step_microbatches(&plan);
        let model = common::fixture(name);
        let args: Vec<String> = vec![
            plan.to_str().unwrap().into(),
            model.to_str().unwrap().into(),
        ];
        let single = one_process_run(&args, step, &dir.path().join(format!("{name}-single")));
        let multi = dir.path().join(format!("{name}-mpi"));
        let mut rank_args = args.clone();
        rank_args.extend(["--output-dir".into(), multi.to_str().unwrap().into()]);
        let Some(mut command) = mpirun(4, &rank_args) else {
            return;
        };
        let out = command.output().unwrap();
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.matches("over mpi").count(), 4, "{text}");
        assert_same_outputs(&single, &multi, &format!("{name} under mpirun (2 x 2)"));
    }
}

#[cfg(feature = "mpi")]
#[test]
fn tensor_parallel_ranks_under_mpirun_give_the_one_process_outputs_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let plan = tensor_parallel_plan(dir.path(), 1, false);
    let step = step_microbatches(&plan);
    let model = common::fixture("gpt2_tiny");
    let args: Vec<String> = vec![
        plan.to_str().unwrap().into(),
        model.to_str().unwrap().into(),
    ];
    let single = one_process_run(&args, step, &dir.path().join("single"));
    let multi = dir.path().join("mpi");
    let mut rank_args = args.clone();
    rank_args.extend(["--output-dir".into(), multi.to_str().unwrap().into()]);
    let Some(mut command) = mpirun(4, &rank_args) else {
        return;
    };
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("over mpi").count(), 4, "{text}");
    assert_same_outputs(
        &single,
        &multi,
        "gpt2_tiny at t = 2 x 2 stages under mpirun",
    );
}

#[cfg(feature = "mpi")]
#[test]
fn under_mpirun_a_rank_that_fails_ends_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = two_stage_job(dir.path(), 4, "5s");
    // Rank 1 is refused its metrics file (a directory), so it fails at start and never
    // receives; rank 0 must not wait for it forever.
    args.extend([
        "--metrics-file".into(),
        dir.path().join("rank-{rank}").to_str().unwrap().into(),
    ]);
    std::fs::create_dir(dir.path().join("rank-1")).unwrap();
    let Some(mut command) = mpirun(2, &args) else {
        return;
    };
    let began = Instant::now();
    let out = command.output().unwrap();
    assert!(!out.status.success());
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "{:?}",
        began.elapsed()
    );
    let message = stderr(&out);
    assert!(message.contains("rank-1"), "{message}");
}

/// The environment of a rank that sees a fake machine of `gpus` GPUs with NCCL (whose unique
/// ids name directories made in `scratch`), or `None` (the skip recorded) where this machine
/// has no NVRTC or cannot build the fakes.
#[cfg(feature = "cuda")]
fn fake_gpus(gpus: u32, scratch: &Path) -> Option<Vec<(String, String)>> {
    let Some(nvrtc) = fake_cuda::venv_nvrtc() else {
        common::skip(
            if cfg!(target_os = "linux") {
                common::Need::Nvrtc
            } else {
                common::Need::Platform
            },
            "no libnvrtc in .venv (run `bash fixtures/pyenv.sh`), so the fake driver has no kernels",
        );
        return None;
    };
    let gpu = fake_cuda::FakeGpu {
        devices: gpus,
        ..fake_cuda::FakeGpu::current()
    };
    match fake_cuda::environment(&gpu, &nvrtc) {
        Ok(mut env) => {
            env.push(("PC_FAKE_NCCL_DIR".into(), scratch.display().to_string()));
            Some(env)
        }
        Err(why) => {
            common::skip(common::Need::Toolchain, why);
            None
        }
    }
}

/// `pipecut run` arguments of `name`'s 2 × 2 plan on the CUDA backend with seeded inputs.
#[cfg(feature = "cuda")]
fn cuda_job(dir: &Path, name: &str) -> (Vec<String>, usize) {
    let plan = two_by_two_plan(dir, name);
    let step = step_microbatches(&plan);
    let args = vec![
        plan.to_str().unwrap().into(),
        common::fixture(name).to_str().unwrap().into(),
        "--backend".into(),
        "cuda".into(),
        "--seed".into(),
        "7".into(),
    ];
    (args, step)
}

#[cfg(feature = "cuda")]
#[test]
fn gpu_ranks_over_nccl_give_the_one_process_cuda_outputs_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let Some(env) = fake_gpus(4, dir.path()) else {
        return;
    };
    for name in common::FIXTURES {
        let (args, step) = cuda_job(dir.path(), name);
        let single = dir.path().join(format!("{name}-single"));
        one_process_run_with(&args, step, &single, &env);
        let multi = dir.path().join(format!("{name}-nccl"));
        let mut rank_args = args.clone();
        rank_args.extend([
            "--output-dir".into(),
            multi.to_str().unwrap().into(),
            "--json".into(),
            "--peer-timeout".into(),
            "60s".into(),
        ]);
        let ranks = wait_all(
            start_ranks_with(4, &[0, 1, 2, 3], &rank_args, &env),
            Duration::from_secs(300),
        );
        for (rank, out) in &ranks {
            let err = stderr(out);
            assert!(out.status.success(), "{name} rank {rank}: {err}");
            assert!(!err.contains("fake lib"), "{name} rank {rank}: {err}");
            let report: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(report["transport"], "nccl", "{name} rank {rank}");
            // LOCAL_RANK r takes GPU r of the four.
            assert_eq!(report["gpu"], *rank, "{name} rank {rank}");
            assert_eq!(report["microbatches_done"], step / 2, "{name} rank {rank}");
            if rank % 2 == 0 {
                assert!(report["bytes_sent"].as_u64().unwrap() > 0);
            }
        }
        assert_same_outputs(&single, &multi, &format!("{name} over NCCL (2 x 2 GPUs)"));
    }
    // GPU ranks that load only their exported stage file, over NCCL.
    let (mut args, _) = cuda_job(dir.path(), "gpt2_tiny");
    let export = dir.path().join("gpt2_tiny-stages");
    export_stages(&args[0], &args[1], &export);
    args[1] = export.to_str().unwrap().into();
    let from_export = dir.path().join("gpt2_tiny-nccl-exported");
    args.extend(["--output-dir".into(), from_export.to_str().unwrap().into()]);
    let ranks = wait_all(
        start_ranks_with(4, &[0, 1, 2, 3], &args, &env),
        Duration::from_secs(300),
    );
    for (rank, out) in &ranks {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("over nccl"), "{text}");
    }
    let whole = dir.path().join("gpt2_tiny-single");
    assert_same_outputs(&whole, &from_export, "gpt2_tiny's export over NCCL");
    // GPU ranks may also talk over TCP (tensors through the host), and NCCL needs GPUs.
    let (mut args, _) = cuda_job(dir.path(), "mlp");
    let over_tcp = dir.path().join("mlp-gpu-tcp");
    args.extend(["--output-dir".into(), over_tcp.to_str().unwrap().into()]);
    args.extend(["--transport".into(), "tcp".into()]);
    let ranks = wait_all(
        start_ranks_with(4, &[0, 1, 2, 3], &args, &env),
        Duration::from_secs(300),
    );
    for (rank, out) in &ranks {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("over tcp"));
    }
    assert_same_outputs(
        &dir.path().join("mlp-single"),
        &over_tcp,
        "mlp, GPU ranks over TCP",
    );
    let plan = dir.path().join("mlp-2x2.json");
    let model = common::fixture("mlp");
    let cpu = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .arg("run")
        .args([&plan, &model])
        .args(["--distributed", "--transport", "nccl"])
        .envs([("RANK", "0"), ("WORLD_SIZE", "4")])
        .envs([("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")])
        .output()
        .unwrap();
    let message = stderr(&cpu);
    assert!(message.contains("needs --backend cuda"), "{message}");
    assert_eq!(message.trim().lines().count(), 1, "{message}");
}

#[cfg(feature = "cuda")]
#[test]
fn a_killed_gpu_rank_ends_the_nccl_job_with_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(env) = fake_gpus(2, dir.path()) else {
        return;
    };
    let mut args = two_stage_job(dir.path(), 512, "5s");
    args.extend(["--backend".into(), "cuda".into()]);
    let ranks = start_ranks_with(2, &[0, 1], &args, &env);
    let message = kill_the_last_stage_after(ranks, Duration::from_millis(3000));
    eprintln!("the survivor said: {message}");
    let last = message
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.contains("rank 1 (stage 1 of replica 0)"),
        "the error names the lost rank and its stage: {message}"
    );
}

/// The fake NCCL is only worth its tests if it refuses what NCCL and a GPU would: a C++
/// program (`tests/fake_cuda/nccl_checks.cpp`) misuses it from two processes on a fake 2-GPU
/// machine and checks every answer.
#[cfg(feature = "cuda")]
#[test]
fn the_fake_nccl_refuses_what_nccl_and_a_gpu_would() {
    let libraries = match fake_cuda::libraries(fake_cuda::Build::Plain) {
        Ok(dir) => dir,
        Err(why) => {
            common::skip(common::Need::Toolchain, why);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("nccl_checks");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let built = Command::new(compiler)
        .args(["-std=c++17", "-O1", "-Wall", "-Werror"])
        .arg(common::root().join("tests/fake_cuda/nccl_checks.cpp"))
        .arg(format!("-L{}", libraries.display()))
        .args(["-l:libcuda.so.1", "-l:libnccl.so.2"])
        .arg(format!("-Wl,-rpath,{}", libraries.display()))
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", stderr(&built));
    let checks = Command::new(&program)
        .env("PC_FAKE_CUDA_DEVICES", "2")
        .env("PC_FAKE_NCCL_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, out) = wait_all(vec![(0, checks)], Duration::from_secs(60)).remove(0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        15,
        "{text}"
    );
}

/// A peer alive but whose NCCL never delivers (the fake's `PC_FAKE_NCCL_SILENT_RANK`: a wedged
/// link) must not hang the job inside NCCL: the receiver gives up after the peer timeout and
/// aborts its communicator, and the sender, waiting on a receiver that is gone, ends too.
#[cfg(feature = "cuda")]
#[test]
fn a_gpu_rank_whose_nccl_never_delivers_ends_the_job_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut env) = fake_gpus(2, dir.path()) else {
        return;
    };
    env.push(("PC_FAKE_NCCL_SILENT_RANK".into(), "0".into()));
    let mut args = two_stage_job(dir.path(), 4, "2s");
    args.extend(["--backend".into(), "cuda".into()]);
    let began = Instant::now();
    let ranks = wait_all(
        start_ranks_with(2, &[0, 1], &args, &env),
        Duration::from_secs(120),
    );
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "{:?}",
        began.elapsed()
    );
    let last_line = |out: &Output| stderr(out).trim().lines().last().unwrap_or("").to_string();
    let (receiver, sender) = (&ranks[1].1, &ranks[0].1);
    eprintln!("receiver: {}\nsender: {}", stderr(receiver), stderr(sender));
    assert!(!receiver.status.success() && !sender.status.success());
    let message = last_line(receiver);
    assert!(
        message.contains(
            "rank 1 (stage 1 of replica 0): rank 0 (stage 0 of replica 0) sent nothing for 2 s"
        ),
        "{}",
        stderr(receiver)
    );
    let message = last_line(sender);
    assert!(
        message.contains("rank 0 (stage 0 of replica 0): rank 1 (stage 1 of replica 0)"),
        "{}",
        stderr(sender)
    );
}

// ---- Issue 37: an authenticated, bounded transport, and jobs that fail as one. ----

/// A two-stage gpt2_tiny job (plan and model) and the run arguments of `microbatches` with
/// `timeout` and outputs into `out`.
fn small_job(dir: &Path, microbatches: usize, timeout: &str, out: &Path) -> Vec<String> {
    let mut args = two_stage_job(dir, microbatches, timeout);
    let at = args.iter().position(|a| a == "--output-dir").unwrap();
    args[at + 1] = out.to_str().unwrap().into();
    args
}

/// The TCP ports process `pid` listens on: its sockets' inodes (`/proc/PID/fd`) matched in
/// `/proc/net/tcp` (state 0A is LISTEN).
fn listening_ports(pid: u32) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let listening =
                f.get(3) == Some(&"0A") && inodes.iter().any(|i| Some(&i.as_str()) == f.get(9));
            let port = f.get(1)?.rsplit(':').next()?;
            listening
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// Waits (up to 30 s) until process `pid` listens on a TCP port, and gives it.
fn wait_listening(pid: u32) -> u16 {
    let began = Instant::now();
    loop {
        if let Some(&port) = listening_ports(pid).first() {
            return port;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "rank {pid} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A figure of `/proc/PID/status` (`VmRSS` in kB, `Threads`).
fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// Watches process `pid`'s resident memory for 2 s: it must stay within 32 MiB of `before_kb`
/// (the first transport zeroing a 1.5 GiB buffer from a header grew a debug build by 87 MiB
/// within those 2 s on the loaded 2-core VM, and a release build faster).
fn assert_holds_nothing_more(pid: u32, before_kb: u64, what: &str) {
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        let grown = proc_status(pid, "VmRSS").saturating_sub(before_kb);
        assert!(grown < 32 << 10, "{what} made rank 1 hold {grown} kB more");
    }
}

/// Connects to `port`, writes `bytes` (ignoring a peer that closes), and keeps the connection.
fn connect_and_send(port: u16, bytes: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let _ = stream.write_all(bytes);
    stream
}

/// What the transport's first version took as a pipecut rank's hello: magic and a rank.
fn old_hello(rank: u32) -> Vec<u8> {
    let mut hello = b"PCUT".to_vec();
    hello.extend_from_slice(&rank.to_le_bytes());
    hello
}

/// A frame header: tag and a length.
fn frame_header(tag: u32, len: u64) -> Vec<u8> {
    let mut header = tag.to_le_bytes().to_vec();
    header.extend_from_slice(&len.to_le_bytes());
    header
}

/// A 2 stages × 2 replicas gpt2_tiny job: its arguments (with `timeout`, outputs into `out`)
/// and the one-process run's outputs.
fn four_rank_job(dir: &Path, timeout: &str, out: &Path) -> (Vec<String>, PathBuf) {
    let plan = two_by_two_plan(dir, "gpt2_tiny");
    let step = step_microbatches(&plan);
    let files = [
        plan.to_str().unwrap().to_string(),
        common::fixture("gpt2_tiny").to_str().unwrap().to_string(),
    ];
    let single = one_process_run(&files, step, &dir.join("single"));
    let mut args = files.to_vec();
    args.extend([
        "--microbatches".into(),
        step.to_string(),
        "--peer-timeout".into(),
        timeout.into(),
    ]);
    args.extend(["--output-dir".into(), out.to_str().unwrap().into()]);
    (args, single)
}

/// Starts ranks 0 and 1 of a four-rank job at `port`: rank 1 has registered (it listens) and
/// waits for ranks 2 and 3; gives the ranks and rank 1's listener.
fn half_a_job(port: u16, args: &[String], env: &[(String, String)]) -> (Vec<(usize, Child)>, u16) {
    let ranks = start_ranks_at(port, 4, &[0, 1], args, env);
    let listener = wait_listening(ranks[1].1.id());
    (ranks, listener)
}

#[test]
fn strangers_at_a_ranks_listener_are_dropped_unread_and_cost_no_memory_or_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (args, single) = four_rank_job(dir.path(), "30s", &dir.path().join("multi"));
    let port = free_port();
    let (mut ranks, listener) = half_a_job(port, &args, &[]);
    let pid = ranks[1].1.id();
    let (threads, rss_kb) = (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));
    // Forged tensors "from rank 0", a header claiming 1.5 GiB, a frame from rank 7 of 4.
    let mut forged = old_hello(0);
    forged.extend(frame_header(0, 64));
    forged.extend([0xAB; 64]);
    let mut strangers = vec![
        connect_and_send(listener, &forged),
        connect_and_send(listener, &[old_hello(0), frame_header(0, 3 << 29)].concat()),
        connect_and_send(
            listener,
            &[old_hello(7), frame_header(0, 4), vec![1; 4]].concat(),
        ),
    ];
    // Idle connections, which said nothing.
    strangers.extend((0..40).map(|_| connect_and_send(listener, &[])));
    assert_holds_nothing_more(pid, rss_kb, "a stranger's header");
    let grown = proc_status(pid, "Threads").saturating_sub(threads);
    assert!(
        grown <= 12,
        "43 strangers took {grown} threads (at most world + 8)"
    );
    ranks.extend(start_ranks_at(port, 4, &[2, 3], &args, &[]));
    let ended = wait_all(ranks, Duration::from_secs(120));
    for (rank, out) in &ended {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    assert_same_outputs(&single, &dir.path().join("multi"), "with strangers about");
    drop(strangers);
}

#[test]
fn a_stranger_at_the_rendezvous_cannot_take_a_ranks_place_or_learn_the_table() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let args = small_job(dir.path(), 8, "30s", &dir.path().join("multi"));
    let single = one_process_run(&args[..2], 8, &dir.path().join("single"));
    let port = free_port();
    let mut ranks = start_ranks_at(port, 2, &[0], &args, &[]);
    wait_listening(ranks[0].1.id());
    // Registers first as rank 1 of 2, in the first version's words, and listens for a table.
    let mut registration = old_hello(1);
    registration.extend(2u32.to_le_bytes());
    registration.extend(4242u16.to_le_bytes());
    let mut stranger = connect_and_send(port, &registration);
    stranger
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let heard = std::thread::spawn(move || {
        let mut heard = Vec::new();
        let _ = stranger.read_to_end(&mut heard);
        heard
    });
    ranks.extend(start_ranks_at(port, 2, &[1], &args, &[]));
    let ended = wait_all(ranks, Duration::from_secs(120));
    for (rank, out) in &ended {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    assert_same_outputs(&single, &dir.path().join("multi"), "with a squatter");
    let heard = String::from_utf8_lossy(&heard.join().unwrap()).into_owned();
    assert!(
        !heard.contains("127.0.0.1:"),
        "the stranger got the table: {heard:?}"
    );
}

/// The key of the job `args` runs (its plan and model files) with `secret`.
fn job_key(args: &[String], secret: &str) -> pipecut::runtime::distributed::auth::JobKey {
    use pipecut::runtime::distributed::auth::{sha256, JobKey};
    let digest = |path: &String| sha256(&std::fs::read(path).unwrap());
    JobKey::new(secret.into(), digest(&args[0]), digest(&args[1]), "test").unwrap()
}

#[test]
fn a_process_holding_the_secret_is_still_bounded_by_the_plan_and_the_world() {
    use pipecut::runtime::distributed::auth::{handshake, Role};
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (args, _) = four_rank_job(dir.path(), "30s", &dir.path().join("out"));
    let secret = "a secret only this job's ranks hold";
    let env = [("PIPECUT_JOB_SECRET".to_string(), secret.to_string())];
    let key = job_key(&args, secret);
    let port = free_port();
    let (mut ranks, listener) = half_a_job(port, &args, &env);
    let pid = ranks[1].1.id();
    let rss_kb = proc_status(pid, "VmRSS");
    let dial = |rank: usize| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", listener)).unwrap();
        let timeout = Duration::from_secs(10);
        handshake(&mut stream, &key, Role::Dialer, rank, 4, timeout).unwrap();
        stream
    };
    // Rank 7 of 4 proves the secret, but no such rank exists: closed unread.
    let mut unknown = dial(7);
    unknown
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        unknown.read(&mut [0u8; 1]).unwrap(),
        0,
        "rank 7's link stays open"
    );
    // "Rank 0" announces 1.5 GiB: refused from the header, nothing allocated.
    let mut huge = dial(0);
    huge.write_all(&frame_header(0, 3 << 29)).unwrap();
    assert_holds_nothing_more(pid, rss_kb, "rank 0's header");
    ranks.extend(start_ranks_at(port, 4, &[2, 3], &args, &env));
    let ended = wait_all(ranks, Duration::from_secs(120));
    for (rank, out) in &ended {
        assert!(!out.status.success(), "rank {rank} ended well");
    }
    let message = stderr(&ended[1].1);
    assert!(
        message
            .contains("rank 0 (stage 0 of replica 0) sent a message of 1610612736 bytes, over the"),
        "{message}"
    );
    assert!(message.contains("bytes the plan lets cross"), "{message}");
}

#[test]
fn ranks_of_another_plan_or_another_secret_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let args = small_job(dir.path(), 2, "3s", &dir.path().join("out"));
    // The same plan written again with other spacing: another file, another digest.
    let plan: Value = serde_json::from_slice(&std::fs::read(&args[0]).unwrap()).unwrap();
    let other = dir.path().join("other.json");
    std::fs::write(&other, serde_json::to_vec(&plan).unwrap()).unwrap();
    let mut other_args = args.clone();
    other_args[0] = other.to_str().unwrap().into();
    let port = free_port();
    let mut ranks = start_ranks_at(port, 2, &[0], &args, &[]);
    ranks.extend(start_ranks_at(port, 2, &[1], &other_args, &[]));
    let ended = wait_all(ranks, Duration::from_secs(60));
    let hex = |path: &String| {
        pipecut::runtime::distributed::auth::hex(&pipecut::runtime::distributed::auth::sha256(
            &std::fs::read(path).unwrap(),
        ))
    };
    let (mine, theirs) = (hex(&args[0]), hex(&other_args[0]));
    for (rank, out) in &ended {
        let message = stderr(out);
        assert!(!out.status.success(), "rank {rank} ran another plan's job");
        assert_eq!(message.trim().lines().count(), 1, "{message}");
        let (here, there) = if *rank == 0 {
            (&mine, &theirs)
        } else {
            (&theirs, &mine)
        };
        assert!(
            message.contains(&format!("plan sha256 {there} there, {here} here")),
            "rank {rank}: {message}"
        );
    }

    let secret = |s: &str| [("PIPECUT_JOB_SECRET".to_string(), s.to_string())];
    let port = free_port();
    let mut ranks = start_ranks_at(port, 2, &[0], &args, &secret("the job's own secret, long"));
    ranks.extend(start_ranks_at(
        port,
        2,
        &[1],
        &args,
        &secret("some other secret, as long"),
    ));
    let ended = wait_all(ranks, Duration::from_secs(60));
    let message = stderr(&ended[1].1);
    assert!(
        message.contains("is not rank 0 of this job: it does not hold the job's secret"),
        "{message}"
    );
    let message = stderr(&ended[0].1);
    assert!(message.contains("rank(s) 1 never joined"), "{message}");
}

/// Waits for every rank of `ranks`, which must all fail within `limit` of `since`; gives
/// their error lines.
fn all_fail_within(ranks: Vec<(usize, Child)>, since: Instant, limit: Duration) -> Vec<String> {
    let ended = wait_all(ranks, limit + Duration::from_secs(60));
    assert!(
        since.elapsed() < limit,
        "the job took {:?} to end",
        since.elapsed()
    );
    ended
        .iter()
        .map(|(rank, out)| {
            let message = stderr(out);
            assert!(!out.status.success(), "rank {rank} ended well");
            assert!(
                String::from_utf8_lossy(&out.stdout).is_empty(),
                "rank {rank} said it ran"
            );
            assert_eq!(message.trim().lines().count(), 1, "rank {rank}: {message}");
            message
        })
        .collect()
}

#[test]
fn a_killed_rank_ends_every_rank_within_seconds_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let plan = two_by_two_plan(dir.path(), "gpt2_tiny");
    let model = common::fixture("gpt2_tiny");
    let args: Vec<String> = vec![
        plan.to_str().unwrap().into(),
        model.to_str().unwrap().into(),
        "--microbatches".into(),
        "2000".into(),
        "--peer-timeout".into(),
        "120s".into(),
        "--output-dir".into(),
        dir.path().join("out").to_str().unwrap().into(),
    ];
    let mut ranks = start_ranks(4, &[0, 1, 2, 3], &args);
    std::thread::sleep(Duration::from_secs(3));
    // Rank 2 is stage 0 of replica 1: ranks 0 and 1 never talk to it before the end.
    let (_, victim) = &mut ranks[2];
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the job ended before the kill"
    );
    victim.kill().unwrap();
    let began = Instant::now();
    let _ = victim.wait();
    let survivors: Vec<_> = ranks.into_iter().filter(|(r, _)| *r != 2).collect();
    for message in all_fail_within(survivors, began, Duration::from_secs(10)) {
        assert!(
            message.contains("rank 2 (stage 0 of replica 1)"),
            "{message}"
        );
    }
}

#[test]
fn a_stopped_rank_ends_the_others_within_the_peer_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let args = small_job(dir.path(), 4096, "3s", &dir.path().join("out"));
    // Rank 1 stopped: rank 0 sends into a receiver that takes nothing (its socket buffers
    // fill, then a send blocks); rank 0 stopped: rank 1 waits for a sender.
    for (victim, survivor) in [(1, 0), (0, 1)] {
        let mut ranks = start_ranks(2, &[0, 1], &args);
        std::thread::sleep(Duration::from_millis(1500));
        let pid = ranks[victim].1.id().to_string();
        assert!(
            ranks[victim].1.try_wait().unwrap().is_none(),
            "the job ended before the stop"
        );
        run_ok(Command::new("kill").args(["-STOP", &pid]));
        let began = Instant::now();
        let (_, mut stopped) = ranks.remove(victim);
        // The peer timeout, then a beat of rank 0's pings and the time to exit.
        let said = all_fail_within(ranks, began, Duration::from_secs(3 + 4));
        let _ = stopped.kill();
        let _ = stopped.wait();
        let name = [
            "rank 0 (stage 0 of replica 0)",
            "rank 1 (stage 1 of replica 0)",
        ][victim];
        assert!(said[0].contains(name), "rank {survivor}: {}", said[0]);
    }
}

#[test]
fn a_rank_failing_before_its_first_message_ends_the_others_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = small_job(dir.path(), 8, "120s", &dir.path().join("out"));
    // Only stage 0 reads the inputs: rank 0 joins, then fails on a missing file.
    args.extend(["--input".into(), "input_ids=/nonexistent/ids.npy".into()]);
    let began = Instant::now();
    let ranks = start_ranks(2, &[0, 1], &args);
    let said = all_fail_within(ranks, began, Duration::from_secs(30));
    assert!(said[0].contains("/nonexistent/ids.npy"), "{}", said[0]);
    assert!(
        said[1].contains("the job failed at rank 0 (stage 0 of replica 0)")
            && said[1].contains("/nonexistent/ids.npy"),
        "{}",
        said[1]
    );
}

#[test]
fn a_collector_that_cannot_write_the_outputs_fails_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    // The output directory is a file: only the collector finds out, at the very end.
    let blocked = dir.path().join("a-file");
    std::fs::write(&blocked, b"").unwrap();
    let args = small_job(dir.path(), 8, "30s", &blocked);
    let began = Instant::now();
    let said = all_fail_within(
        start_ranks(2, &[0, 1], &args),
        began,
        Duration::from_secs(60),
    );
    assert!(
        said[0].contains("the job failed at rank 1 (stage 1 of replica 0)")
            && said[0].contains("a-file"),
        "{}",
        said[0]
    );
}

/// torchrun from `TORCHRUN`, else from the repository's `.venv-python` (which `.ci/run` makes
/// before `cargo test`); a recorded skip where there is none, which CI refuses.
fn torchrun() -> Option<PathBuf> {
    let path = std::env::var_os("TORCHRUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::root().join(".venv-python/bin/torchrun"));
    if path.is_file() {
        return Some(path);
    }
    common::skip(
        common::Need::Torch,
        format!(
            "no torchrun at {} (set TORCHRUN, or make .venv-python as .ci/run does)",
            path.display()
        ),
    );
    None
}

#[test]
fn the_documented_torchrun_command_runs_the_job_with_either_rendezvous() {
    let Some(torchrun) = torchrun() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let args = small_job(dir.path(), 8, "60s", &dir.path().join("unused"));
    let single = one_process_run(&args[..2], 8, &dir.path().join("single"));
    let (static_port, _next_port_taken) = free_port_and_the_next_held();
    let static_port = static_port.to_string();
    let endpoint = format!("127.0.0.1:{}", free_port());
    let rendezvous: [&[&str]; 2] = [
        &["--master-addr", "127.0.0.1", "--master-port", &static_port],
        &["--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint],
    ];
    for (i, how) in rendezvous.into_iter().enumerate() {
        let out = dir.path().join(format!("torchrun-{i}"));
        let mut command = Command::new(&torchrun);
        command
            .args(["--nnodes", "1", "--nproc-per-node", "2"])
            .args(how)
            .arg("--no-python")
            .arg(env!("CARGO_BIN_EXE_pipecut"))
            .arg("run")
            .args(&args[..args.len() - 2])
            .args(["--distributed", "--output-dir", out.to_str().unwrap()]);
        run_ok(&mut command);
        assert_same_outputs(&single, &out, &format!("torchrun {how:?}"));
    }
}

/// gpt2_tiny copied into `dir` with each initializer of 1 KiB or more in a file of its own
/// (`<name>.bin`, as `onnx.save_model(..., all_tensors_to_one_file=False)` writes them); gives
/// the model's path.
fn with_a_file_per_weight(dir: &Path) -> PathBuf {
    use onnx_protobuf::tensor_proto::DataLocation;
    use onnx_protobuf::{Message, ModelProto, StringStringEntryProto};
    std::fs::create_dir_all(dir).unwrap();
    let bytes = std::fs::read(common::fixture("gpt2_tiny")).unwrap();
    let mut model = ModelProto::parse_from_bytes(&bytes).unwrap();
    for (i, init) in model
        .graph
        .as_mut()
        .unwrap()
        .initializer
        .iter_mut()
        .enumerate()
    {
        if init.raw_data.len() < 1024 {
            continue;
        }
        let file = format!("w{i}.bin");
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
            ..Default::default()
        };
        init.external_data = vec![
            entry("location", file.clone()),
            entry("length", init.raw_data.len().to_string()),
        ];
        std::fs::write(dir.join(file), std::mem::take(&mut init.raw_data)).unwrap();
        init.data_location = DataLocation::EXTERNAL.into();
    }
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path
}

/// The external weight files of `model` that only stage `stage` of `plan` reads.
fn weight_files_only_of_stage(model: &Path, plan: &Path, stage: usize) -> Vec<String> {
    use onnx_protobuf::{Message, ModelProto};
    let plan: Value = serde_json::from_slice(&std::fs::read(plan).unwrap()).unwrap();
    let stage_of = |node: &str| {
        plan["stages"]
            .as_array()
            .unwrap()
            .iter()
            .position(|s| s["nodes"].as_array().unwrap().iter().any(|n| n == node))
            .unwrap()
    };
    let proto = ModelProto::parse_from_bytes(&std::fs::read(model).unwrap()).unwrap();
    let graph = proto.graph.as_ref().unwrap();
    let mut files = Vec::new();
    for init in graph
        .initializer
        .iter()
        .filter(|i| !i.external_data.is_empty())
    {
        let stages: std::collections::BTreeSet<usize> = graph
            .node
            .iter()
            .filter(|n| n.input.contains(&init.name))
            .map(|n| stage_of(&n.name))
            .collect();
        if stages == std::collections::BTreeSet::from([stage]) {
            files.push(init.external_data[0].value.clone());
        }
    }
    assert!(
        !files.is_empty(),
        "stage {stage} reads no weight of its own"
    );
    files
}

/// A two-stage gpt2_tiny job whose weights are a file each, copied into `dir/a` and `dir/b`:
/// the plan, and each copy's arguments for `pipecut run` (outputs into `dir/out`).
fn job_with_weight_files(dir: &Path, timeout: &str) -> (PathBuf, [Vec<String>; 2]) {
    let a = with_a_file_per_weight(&dir.join("a"));
    with_a_file_per_weight(&dir.join("b"));
    let plan = dir.join("plan.json");
    run_ok(
        pipecut()
            .args(["partition", a.to_str().unwrap(), "--devices", "cpu,cpu"])
            .args(["--dim", "batch=2"])
            .args(dims_without_batch("gpt2_tiny"))
            .arg("--out")
            .arg(&plan),
    );
    let args = |copy: &str| -> Vec<String> {
        vec![
            plan.to_str().unwrap().into(),
            dir.join(copy).join("model.onnx").to_str().unwrap().into(),
            "--microbatches".into(),
            "4".into(),
            "--peer-timeout".into(),
            timeout.into(),
            "--output-dir".into(),
            dir.join("out").to_str().unwrap().into(),
        ]
    };
    let both = [args("a"), args("b")];
    (plan, both)
}

/// Starts rank 0 of a two-rank job with `args[0]` and rank 1 with `args[1]`.
fn start_two_ranks_apart(args: &[Vec<String>; 2]) -> Vec<(usize, Child)> {
    start_two_ranks_at(free_port(), args, &[])
}

/// [`start_two_ranks_apart`] with `MASTER_PORT` `port` and `env` set.
fn start_two_ranks_at(
    port: u16,
    args: &[Vec<String>; 2],
    env: &[(String, String)],
) -> Vec<(usize, Child)> {
    let mut ranks = start_ranks_at(port, 2, &[0], &args[0], env);
    ranks.extend(start_ranks_at(port, 2, &[1], &args[1], env));
    ranks
}

#[test]
fn each_rank_reads_only_its_own_stages_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (plan, args) = job_with_weight_files(dir.path(), "60s");
    let single = one_process_run(&args[0][..2], 4, &dir.path().join("single"));
    // Rank 0's copy lacks stage 1's own weights, rank 1's copy stage 0's: each machine holds
    // only what its stage reads.
    for (copy, other_stage) in [("a", 1), ("b", 0)] {
        let model = dir.path().join(copy).join("model.onnx");
        for file in weight_files_only_of_stage(&model, &plan, other_stage) {
            std::fs::remove_file(dir.path().join(copy).join(file)).unwrap();
        }
    }
    let ended = wait_all(start_two_ranks_apart(&args), Duration::from_secs(120));
    for (rank, out) in &ended {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    assert_same_outputs(
        &single,
        &dir.path().join("out"),
        "ranks with half the weights",
    );
}

#[test]
fn a_rank_failing_while_it_loads_ends_every_rank_at_once_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (plan, args) = job_with_weight_files(dir.path(), "120s");
    for (failing, copy) in [(1, "b"), (0, "a")] {
        let model = dir.path().join(copy).join("model.onnx");
        let lost = &weight_files_only_of_stage(&model, &plan, failing)[0];
        let held = std::fs::read(dir.path().join(copy).join(lost)).unwrap();
        std::fs::remove_file(dir.path().join(copy).join(lost)).unwrap();
        let began = Instant::now();
        // Well within the 120 s peer timeout: the others hear of it as soon as it fails.
        let said = all_fail_within(start_two_ranks_apart(&args), began, Duration::from_secs(20));
        assert!(said[failing].contains(lost.as_str()), "{}", said[failing]);
        let other = &said[1 - failing];
        assert!(
            other.contains(&format!("rank {failing} failed before it joined the job"))
                && other.contains(lost.as_str()),
            "rank {}: {other}",
            1 - failing
        );
        std::fs::write(dir.path().join(copy).join(lost), held).unwrap();
    }
}

/// A torch `TCPStore` served the way torchrun's agent serves it, in a Python process of the
/// repository's `.venv-python` (the one torchrun comes from); gives the process and its port.
fn torch_store() -> Option<(Child, u16)> {
    let python = torchrun()?.with_file_name("python");
    let serve = "import sys, torch.distributed as d\n\
                 s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n\
                 print(s.port, flush=True)\n\
                 sys.stdin.read()\n";
    // It serves until its stdin closes: when the test ends, however it ends.
    let mut child = Command::new(python)
        .args(["-c", serve])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python starts");
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let port = line.trim().parse().expect("the store prints its port");
    Some((child, port))
}

#[test]
fn through_torchruns_store_ranks_meet_and_a_rank_failing_while_it_loads_is_named() {
    let Some((mut store, port)) = torch_store() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (plan, args) = job_with_weight_files(dir.path(), "120s");
    let agent = |attempt: usize| {
        vec![
            (
                "TORCHELASTIC_USE_AGENT_STORE".to_string(),
                "True".to_string(),
            ),
            ("TORCHELASTIC_RUN_ID".into(), "store-test".into()),
            ("TORCHELASTIC_RESTART_COUNT".into(), attempt.to_string()),
        ]
    };
    let start = |attempt: usize| start_two_ranks_at(port, &args, &agent(attempt));
    let single = one_process_run(&args[0][..2], 4, &dir.path().join("single"));
    let ended = wait_all(start(0), Duration::from_secs(120));
    for (rank, out) in &ended {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    assert_same_outputs(
        &single,
        &dir.path().join("out"),
        "ranks met through the store",
    );
    // Rank 0 fails before it listens for the job: it still publishes where it tells why.
    let model = dir.path().join("a").join("model.onnx");
    let lost = &weight_files_only_of_stage(&model, &plan, 0)[0];
    std::fs::remove_file(dir.path().join("a").join(lost)).unwrap();
    let began = Instant::now();
    let said = all_fail_within(start(1), began, Duration::from_secs(20));
    assert!(
        said[1].contains("rank 0 failed before it joined the job")
            && said[1].contains(lost.as_str()),
        "rank 1: {}",
        said[1]
    );
    drop(store.stdin.take());
    assert!(store.wait().unwrap().success());
}

#[test]
fn a_rank_whose_exported_stage_file_was_changed_is_refused_and_ends_the_job() {
    use onnx_protobuf::{Message, ModelProto};
    let dir = tempfile::tempdir().unwrap();
    let mut args = two_stage_job(dir.path(), 4, "120s");
    let export = dir.path().join("stages");
    export_stages(&args[0], &args[1], &export);
    // Still a valid stage model, with the exported graph and weights: only its bytes differ.
    let stage_1 = export.join("stage_1.onnx");
    let mut model = ModelProto::parse_from_bytes(&std::fs::read(&stage_1).unwrap()).unwrap();
    model.doc_string = "edited after the export".into();
    std::fs::write(&stage_1, model.write_to_bytes().unwrap()).unwrap();
    args[1] = export.to_str().unwrap().into();
    let began = Instant::now();
    let said = all_fail_within(
        start_ranks(2, &[0, 1], &args),
        began,
        Duration::from_secs(20),
    );
    assert!(
        said[1].contains("stage_1.onnx' is not the file that was exported"),
        "{}",
        said[1]
    );
    assert!(
        said[0].contains("rank 1 failed before it joined the job")
            && said[0].contains("not the file that was exported"),
        "{}",
        said[0]
    );
}

/// A uint8 activation crosses between stages as bytes: a `[2048, 2048]` uint8 input transposed
/// twice, one Transpose a stage. The ranks' outputs are the one-process run's, and rank 0 sends
/// about the 4 MiB the tensor holds. The runtime held uint8 as int64, so the message was 32 MiB,
/// over the 17 MiB bound the plan sets from the declared dtype, and the job failed on it.
#[test]
fn a_uint8_activation_crosses_between_ranks_as_bytes() {
    const UINT8: i32 = 2;
    const SIDE: i64 = 2048;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("transposes.onnx");
    let perm: &[i64] = &[1, 0];
    let bytes = common::onnx_model_bytes(
        17,
        vec![common::tensor_value_info("x", UINT8, &[SIDE, SIDE])],
        vec![common::tensor_value_info("y", UINT8, &[SIDE, SIDE])],
        vec![
            common::onnx_node("Transpose", &["x"], "t", Some(("perm", perm))),
            common::onnx_node("Transpose", &["t"], "y", Some(("perm", perm))),
        ],
    );
    std::fs::write(&model, bytes).unwrap();
    let plan = dir.path().join("plan.json");
    run_ok(
        pipecut()
            .arg("partition")
            .arg(&model)
            .args(["--devices", "cpu,cpu", "--stages", "2", "--out"])
            .arg(&plan),
    );
    let args: Vec<String> = vec![
        plan.to_str().unwrap().into(),
        model.to_str().unwrap().into(),
        "--seed".into(),
        "7".into(),
    ];
    let single = one_process_run(&args, 1, &dir.path().join("single"));
    let multi = dir.path().join("multi");
    let mut rank_args = args.clone();
    rank_args.extend([
        "--microbatches".into(),
        "1".into(),
        "--output-dir".into(),
        multi.to_str().unwrap().into(),
        "--json".into(),
        "--peer-timeout".into(),
        "60s".into(),
    ]);
    let ranks = wait_all(
        start_ranks(2, &[0, 1], &rank_args),
        Duration::from_secs(300),
    );
    for (rank, out) in &ranks {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    let report: Value = serde_json::from_slice(&ranks[0].1.stdout).unwrap();
    assert_eq!(report["stage"], 0);
    let sent = report["bytes_sent"].as_u64().unwrap();
    let tensor = (SIDE * SIDE) as u64;
    assert!(
        (tensor..tensor + 4096).contains(&sent),
        "rank 0 sent {sent} bytes for a {tensor}-byte tensor"
    );
    assert_same_outputs(&single, &multi, "uint8 transposes (2 stages)");
}

/// 16-bit and 8-bit float activations cross between stages within the plan's bound: a
/// `[1024, 1024]` int16, uint16, float16 or float8 input transposed in stage 0 and summed in
/// stage 1, so the one large tensor that crosses sets the bound (twice its declared size, plus a
/// MiB: stage 1 makes one value). The runtime holds int16 and uint16 as int64 and the floats as
/// f32, and sends them so; the bound counted declared bytes, so rank 1 refused the int16 and
/// uint16 messages (8,388,753 bytes over a 5,242,884-byte bound) and the float8 one (4,194,449
/// over 3,145,730), and the job failed (float16, at twice, fit). Now each job, from the model
/// file or from its export's stage files, gives the one-process outputs, and rank 0 sends what
/// the runtime holds.
#[test]
fn narrow_activations_cross_between_ranks_within_the_bound() {
    const SIDE: i64 = 1024;
    // (name, ONNX elem type, bytes an element takes where the runtime holds it)
    let cases = [
        ("int16", 5, 8),
        ("uint16", 4, 8),
        ("float16", 10, 4),
        ("float8e4m3fn", 17, 4),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (dtype, elem_type, held) in cases {
        let model = dir.path().join(format!("{dtype}.onnx"));
        let perm: &[i64] = &[1, 0];
        let bytes = common::onnx_model_bytes(
            19,
            vec![common::tensor_value_info("x", elem_type, &[SIDE, SIDE])],
            vec![common::tensor_value_info("y", elem_type, &[1, 1])],
            vec![
                common::onnx_node("Transpose", &["x"], "t", Some(("perm", perm))),
                common::onnx_node("ReduceSum", &["t"], "y", None),
            ],
        );
        std::fs::write(&model, bytes).unwrap();
        let plan = dir.path().join(format!("{dtype}.json"));
        run_ok(
            pipecut()
                .arg("partition")
                .arg(&model)
                .args(["--devices", "cpu,cpu", "--stages", "2", "--out"])
                .arg(&plan),
        );
        let export = dir.path().join(format!("{dtype}-export"));
        export_stages(&plan, &model, &export);
        let whole = [&plan, &model].map(|p| p.to_str().unwrap().to_string());
        let single = one_process_run(&whole, 1, &dir.path().join(format!("{dtype}-single")));
        for (from, file) in [("model", &model), ("export", &export)] {
            let multi = dir.path().join(format!("{dtype}-{from}"));
            let what = format!("{dtype} transpose and sum, 2 ranks from the {from}");
            let sent = two_rank_job(&plan, file, &multi, &what);
            let tensor = (SIDE * SIDE) as u64 * held;
            assert!(
                (tensor..tensor + 4096).contains(&sent),
                "{what}: rank 0 sent {sent} bytes for a tensor held in {tensor} bytes"
            );
            assert_same_outputs(&single, &multi, &what);
        }
    }
}

/// Runs `pipecut run PLAN MODEL` (a model file or an export) as ranks 0 and 1 of a job, with
/// one micro-batch and the default seed, writing outputs to `out`; gives the bytes rank 0 sent.
fn two_rank_job(plan: &Path, model: &Path, out: &Path, what: &str) -> u64 {
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let mut args = vec![path(plan), path(model), "--output-dir".into(), path(out)];
    args.extend(["--microbatches", "1", "--json", "--peer-timeout", "60s"].map(String::from));
    let ranks = wait_all(start_ranks(2, &[0, 1], &args), Duration::from_secs(300));
    for (rank, out) in &ranks {
        assert!(out.status.success(), "{what}, rank {rank}: {}", stderr(out));
    }
    let report: Value = serde_json::from_slice(&ranks[0].1.stdout).unwrap();
    assert_eq!(report["stage"], 0, "{what}");
    report["bytes_sent"].as_u64().unwrap()
}
