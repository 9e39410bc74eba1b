//! Who may talk to a rank: every TCP connection of a job (the rendezvous and each peer link)
//! starts with a challenge-response that proves both ends hold the job's secret, before either
//! end reads a frame, then the two ends compare the digests of the plan and the model they run.
//!
//! ```text
//! hello = b"PCUT", u8 version, u8 role (0 dialer, 1 listener; + 2 from a rank that failed
//!         before it could join), u32 rank, u32 world, [u8; 32] nonce
//! proof = HMAC-SHA256(secret, b"pipecut-tcp-v1" || own hello || peer's hello)
//! then, once both proofs checked: [u8; 32] plan sha256, [u8; 32] model sha256
//! ```
//!
//! Each end sends its hello, reads the peer's, sends its proof and checks the peer's. A proof
//! covers the prover's fresh nonce and the verifier's, so a recorded proof is useless later, and
//! the role byte makes a proof made as listener worthless as a dialer's (a process cannot hand a
//! rank's own challenge back to it, or relay one rank's challenge to another without sitting on
//! the path of a connection). The digests cross only after both proofs, so a process without the
//! secret learns nothing of the job. A rank that failed before it could join (and comes to the
//! rendezvous only to say why, or as rank 0 only to tell the others) has no model to compare:
//! the model digests are not checked on its connections, the plan's are.
//!
//! HMAC comes from RustCrypto's `hmac` crate over the workspace's `sha2`: a hand-made
//! `sha256(key || message)` is open to length extension, and `hmac`'s `verify_slice` compares
//! tags in constant time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::Error;

const MAGIC: &[u8; 4] = b"PCUT";
const VERSION: u8 = 1;
const HELLO_BYTES: usize = 4 + 1 + 1 + 4 + 4 + 32;
const CONTEXT: &[u8] = b"pipecut-tcp-v1";
/// The variable holding the job's secret, and the one naming a file that holds it.
pub const SECRET_VAR: &str = "PIPECUT_JOB_SECRET";
/// See [`SECRET_VAR`].
pub const SECRET_FILE_VAR: &str = "PIPECUT_JOB_SECRET_FILE";
/// A secret shorter than this is refused: it could be guessed.
const MIN_SECRET_BYTES: usize = 16;

/// What every rank of one job shares: the secret and the digests of the plan and the model.
#[derive(Clone)]
pub struct JobKey {
    secret: Vec<u8>,
    /// sha256 of the plan file.
    pub plan: [u8; 32],
    /// sha256 of the model file (for an export, of the model it was exported from).
    pub model: [u8; 32],
    /// Where the secret came from, for errors (`PIPECUT_JOB_SECRET`, `derived`).
    pub origin: String,
    /// Whether this is the key of a rank that failed before it could join: its model
    /// digest means nothing ([`JobKey::failed_before_joining`]).
    failed: bool,
}

impl std::fmt::Debug for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        f.debug_struct("JobKey")
            .field("plan", &hex(&self.plan))
            .field("model", &hex(&self.model))
            .field("origin", &self.origin)
            .finish()
    }
}

impl JobKey {
    /// The key of a job whose secret is `secret` (at least 16 bytes).
    pub fn new(
        secret: Vec<u8>,
        plan: [u8; 32],
        model: [u8; 32],
        origin: &str,
    ) -> Result<JobKey, Error> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(Error::Distributed(format!(
                "the job's secret ({origin}) is {} byte(s): use at least {MIN_SECRET_BYTES} \
                 (e.g. `openssl rand -hex 32`)",
                secret.len()
            )));
        }
        Ok(JobKey {
            secret,
            plan,
            model,
            origin: origin.to_string(),
            failed: false,
        })
    }

    /// This key, for a rank that failed before it could join and meets the job only to say
    /// so: it says so in its hellos, and no model digest is compared on its connections.
    pub fn failed_before_joining(mut self) -> JobKey {
        self.failed = true;
        self
    }

    /// The key from `PIPECUT_JOB_SECRET` or the file `PIPECUT_JOB_SECRET_FILE` names (`var`
    /// reads the environment); without either, a secret derived from what every rank of the
    /// job shares: `graph` (the digest of the model's graph the plan records, the same for
    /// every plan of that model and for any weights, so that ranks given another plan file or
    /// other weights still meet and are refused naming both digests), the rendezvous address
    /// and the world size. A derived secret keeps out processes that do not know those
    /// (another job, a scanner, a stale rank of an earlier run), not a user who can read the
    /// plan or the model.
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        plan: [u8; 32],
        model: [u8; 32],
        graph: &str,
        rendezvous: &str,
        world: usize,
    ) -> Result<JobKey, Error> {
        if let Some(secret) = var(SECRET_VAR) {
            return JobKey::new(secret.into_bytes(), plan, model, SECRET_VAR);
        }
        if let Some(path) = var(SECRET_FILE_VAR) {
            let bytes = std::fs::read(&path).map_err(|e| {
                Error::Distributed(format!("{SECRET_FILE_VAR}={path}: cannot read it: {e}"))
            })?;
            let secret = bytes.trim_ascii_end().to_vec();
            return JobKey::new(secret, plan, model, &format!("{SECRET_FILE_VAR}={path}"));
        }
        let mut derived = Sha256::new();
        derived.update(b"pipecut derived job secret v1");
        for part in [graph, rendezvous] {
            derived.update((part.len() as u64).to_le_bytes());
            derived.update(part.as_bytes());
        }
        derived.update((world as u64).to_le_bytes());
        let origin = "derived from the model's graph, the rendezvous and the world size";
        JobKey::new(derived.finalize().to_vec(), plan, model, origin)
    }

    fn proof(&self, own: &[u8], peer: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        mac.update(CONTEXT);
        mac.update(own);
        mac.update(peer);
        mac
    }
}

/// Which end of a connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The end that connected.
    Dialer,
    /// The end that accepted.
    Listener,
}

/// What the peer proved it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its rank.
    pub rank: usize,
    /// The world size it was started with.
    pub world: usize,
    /// Whether it failed before it could join ([`JobKey::failed_before_joining`]).
    pub failed: bool,
}

/// Why a handshake failed.
#[derive(Debug)]
pub enum Refusal {
    /// The connection failed or stayed silent before the peer's proof came (a listener
    /// busy with other connections drops new ones): worth trying again.
    Unheard(String),
    /// The peer is not a rank of this job (no hello, a wrong one, or no proof of the secret):
    /// a listener drops it silently, a dialer reports it.
    Stranger(String),
    /// An authenticated rank of this job that runs another plan or model, or another world.
    Mismatch(String),
    /// Rank 0 says the job failed before it started (a rank failed while it loaded).
    JobFailed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unheard(detail)
            | Refusal::Stranger(detail)
            | Refusal::Mismatch(detail)
            | Refusal::JobFailed(detail) => f.write_str(detail),
        }
    }
}

/// Runs the handshake as `role` for `rank` of `world` on `stream`, every read waiting at most
/// `timeout`; the stream's read timeout is cleared again on success.
pub fn handshake(
    stream: &mut TcpStream,
    key: &JobKey,
    role: Role,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<Peer, Refusal> {
    let stranger = |detail: String| Refusal::Stranger(detail);
    let io = |what: &str, e: std::io::Error| Refusal::Unheard(format!("{what}: {e}"));
    stream
        .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(|e| io("cannot time the handshake", e))?;
    let own = hello(role, key.failed, rank, world).map_err(stranger)?;
    stream
        .write_all(&own)
        .map_err(|e| io("sending the hello", e))?;
    let mut theirs = [0u8; HELLO_BYTES];
    stream
        .read_exact(&mut theirs)
        .map_err(|e| io("no hello came", e))?;
    let peer = check_hello(&theirs, &own, role).map_err(stranger)?;
    let proof = key.proof(&own, &theirs).finalize().into_bytes();
    stream
        .write_all(&proof)
        .map_err(|e| io("sending the proof", e))?;
    let mut their_proof = [0u8; 32];
    stream
        .read_exact(&mut their_proof)
        .map_err(|e| io("no proof came", e))?;
    key.proof(&theirs, &own)
        .verify_slice(&their_proof)
        .map_err(|_| {
            stranger(format!(
                "it does not hold the job's secret ({}; every rank needs the same)",
                key.origin
            ))
        })?;
    let mut digests = key.plan.to_vec();
    digests.extend_from_slice(&key.model);
    stream
        .write_all(&digests)
        .map_err(|e| io("sending the digests", e))?;
    let mut their_digests = [0u8; 64];
    stream
        .read_exact(&mut their_digests)
        .map_err(|e| stranger(format!("no digests came: {e}")))?;
    // A failed rank has no model to compare.
    let models_known = !peer.failed && !key.failed;
    compare(key, &their_digests, peer, world, models_known)?;
    stream
        .set_read_timeout(None)
        .map_err(|e| io("cannot clear the handshake's timeout", e))?;
    Ok(peer)
}

/// The role byte's flag of a rank that failed before it could join.
const FAILED: u8 = 2;

fn hello(role: Role, failed: bool, rank: usize, world: usize) -> Result<Vec<u8>, String> {
    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce).map_err(|e| format!("no random nonce: {e}"))?;
    let mut hello = MAGIC.to_vec();
    hello.push(VERSION);
    hello.push(role as u8 | if failed { FAILED } else { 0 });
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    hello.extend_from_slice(&nonce);
    Ok(hello)
}

/// The peer's rank and world from its hello, which must come from the other role and carry
/// another nonce than ours (a hello sent back to us is refused).
fn check_hello(theirs: &[u8; HELLO_BYTES], own: &[u8], role: Role) -> Result<Peer, String> {
    if &theirs[..4] != MAGIC || theirs[4] != VERSION {
        return Err("not a pipecut rank of this version".into());
    }
    let expected = match role {
        Role::Dialer => Role::Listener,
        Role::Listener => Role::Dialer,
    } as u8;
    if theirs[5] & !FAILED != expected || theirs[14..] == own[14..] {
        return Err("its hello is not an answer to ours".into());
    }
    let word = |at: usize| u32::from_le_bytes(theirs[at..at + 4].try_into().expect("4 bytes"));
    Ok(Peer {
        rank: word(6) as usize,
        world: word(10) as usize,
        failed: theirs[5] & FAILED != 0,
    })
}

fn compare(
    key: &JobKey,
    theirs: &[u8; 64],
    peer: Peer,
    world: usize,
    models_known: bool,
) -> Result<(), Refusal> {
    let (plan, model) = theirs.split_at(32);
    let mut differ = Vec::new();
    if plan != key.plan {
        differ.push(format!(
            "plan sha256 {} there, {} here",
            hex(plan),
            hex(&key.plan)
        ));
    }
    if models_known && model != key.model {
        differ.push(format!(
            "model sha256 {} there, {} here",
            hex(model),
            hex(&key.model)
        ));
    }
    if peer.world != world {
        differ.push(format!("{} ranks there, {world} here", peer.world));
    }
    if differ.is_empty() {
        return Ok(());
    }
    Err(Refusal::Mismatch(format!(
        "rank {} runs another job: {} (give every rank the same plan and model files)",
        peer.rank,
        differ.join("; ")
    )))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    fn key(secret: &str, plan: u8) -> JobKey {
        JobKey::new(secret.as_bytes().to_vec(), [plan; 32], [7; 32], "test").unwrap()
    }

    /// Runs a handshake between a listener with `listener_key` and a dialer with `dialer_key`.
    fn meet(
        listener_key: JobKey,
        dialer_key: JobKey,
    ) -> (Result<Peer, Refusal>, Result<Peer, Refusal>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let second = Duration::from_secs(5);
        let accepting = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            handshake(&mut stream, &listener_key, Role::Listener, 0, 2, second)
        });
        let mut stream = TcpStream::connect(addr).unwrap();
        let dialed = handshake(&mut stream, &dialer_key, Role::Dialer, 1, 2, second);
        (accepting.join().unwrap(), dialed)
    }

    #[test]
    fn ranks_with_one_secret_meet_and_learn_each_others_rank() {
        let (l, d) = meet(key("a secret of the job", 1), key("a secret of the job", 1));
        let peer = |rank| Peer {
            rank,
            world: 2,
            failed: false,
        };
        assert_eq!(l.unwrap(), peer(1));
        assert_eq!(d.unwrap(), peer(0));
    }

    #[test]
    fn another_secret_is_a_stranger_and_another_plan_names_both_digests() {
        let (l, d) = meet(
            key("a secret of the job", 1),
            key("another job's secret", 1),
        );
        assert!(matches!(l, Err(Refusal::Stranger(_))), "{l:?}");
        assert!(d
            .unwrap_err()
            .to_string()
            .contains("does not hold the job's secret"));
        let (l, _) = meet(key("a secret of the job", 1), key("a secret of the job", 2));
        let message = l.unwrap_err().to_string();
        assert!(
            message.contains(&format!(
                "plan sha256 {} there, {} here",
                hex(&[2; 32]),
                hex(&[1; 32])
            )),
            "{message}"
        );
    }

    #[test]
    fn a_short_secret_is_refused_and_a_derived_one_depends_on_the_job() {
        let short = JobKey::new(b"short".to_vec(), [0; 32], [0; 32], "PIPECUT_JOB_SECRET");
        assert!(short.unwrap_err().to_string().contains("5 byte(s)"));
        let none = |_: &str| None;
        let a = JobKey::from_vars(none, [1; 32], [2; 32], "g", "h:1", 2).unwrap();
        let b = JobKey::from_vars(none, [1; 32], [2; 32], "g", "h:2", 2).unwrap();
        let c = JobKey::from_vars(none, [3; 32], [4; 32], "g", "h:1", 2).unwrap();
        assert!(a.origin.starts_with("derived"));
        assert_ne!(a.secret, b.secret);
        assert_eq!(
            a.secret, c.secret,
            "other plans of one graph meet, to be told apart"
        );
    }
}
