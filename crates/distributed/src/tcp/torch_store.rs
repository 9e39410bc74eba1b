//! Just enough of a client of torch's `TCPStore` (the key-value store torchrun's agent serves
//! at `MASTER_ADDR:MASTER_PORT`) for rank 0 to publish where it listens and for the other
//! ranks to wait for it: validate, set, wait, get.
//!
//! The wire format is torch's (`torch/csrc/distributed/c10d/TCPStoreBackend.hpp` and the
//! libuv server beside it, the default since torch 2.4): a query is one byte, then its
//! fields; numbers are in the host's byte order (torch copies them as they lie in memory), a
//! key or value is a `u64` length and its bytes. The store is a peer like any
//! other: every read is bounded in length and by the caller's deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::Error;

/// The first query of every connection, followed by [`MAGIC`].
const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const WAIT: u8 = 6;
/// torch's `validationMagicNumber`.
const MAGIC: u32 = 0x3C85_F7CE;
/// The answer to a wait once every key is set.
const STOP_WAITING: u8 = 0;
/// The longest value this client reads back: an address.
const MAX_VALUE: u64 = 1024;

/// A validated connection to a torch store.
pub(super) struct TorchStore {
    stream: TcpStream,
    address: String,
}

impl TorchStore {
    /// Connects to the store at `address` (`host:port`), trying again until `deadline` while
    /// nothing listens there yet.
    pub(super) fn connect(address: &str, deadline: Instant) -> Result<TorchStore, Error> {
        let store = address
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| {
                Error::Distributed(format!(
                    "cannot resolve torchrun's store address '{address}'"
                ))
            })?;
        let stream = super::connect_until(store, deadline).map_err(|e| {
            Error::Distributed(format!("cannot reach torchrun's store at {address}: {e}"))
        })?;
        let mut store = TorchStore {
            stream,
            address: address.to_string(),
        };
        let mut query = vec![VALIDATE];
        query.extend_from_slice(&MAGIC.to_ne_bytes());
        store.send(&query, deadline)?;
        Ok(store)
    }

    /// Sets `key` to `value`, and reads it back: a set has no answer, and the read shows that
    /// the store took it (and that a store answers at all).
    pub(super) fn set(&mut self, key: &str, value: &[u8], deadline: Instant) -> Result<(), Error> {
        let mut query = vec![SET];
        put_bytes(&mut query, key.as_bytes());
        put_bytes(&mut query, value);
        self.send(&query, deadline)?;
        let stored = self.get(key, deadline)?;
        if stored != value {
            return Err(self.error(&format!(
                "set {key} to {:?} but read back {:?}",
                String::from_utf8_lossy(value),
                String::from_utf8_lossy(&stored)
            )));
        }
        Ok(())
    }

    /// Waits until `key` is set (at most until `deadline`), then reads it.
    pub(super) fn wait_get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, Error> {
        let mut query = vec![WAIT];
        query.extend_from_slice(&1u64.to_ne_bytes());
        put_bytes(&mut query, key.as_bytes());
        self.send(&query, deadline)?;
        let mut answer = [0u8; 1];
        self.receive(&mut answer, deadline).map_err(|e| {
            if Instant::now() >= deadline {
                self.error(&format!("{key} was not set before the peer timeout"))
            } else {
                e
            }
        })?;
        if answer[0] != STOP_WAITING {
            return Err(self.error(&format!("answered a wait with {}", answer[0])));
        }
        self.get(key, deadline)
    }

    fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, Error> {
        let mut query = vec![GET];
        put_bytes(&mut query, key.as_bytes());
        self.send(&query, deadline)?;
        let mut length = [0u8; 8];
        self.receive(&mut length, deadline)?;
        let length = u64::from_ne_bytes(length);
        if length > MAX_VALUE {
            return Err(self.error(&format!(
                "{key} holds {length} bytes, more than an address ({MAX_VALUE})"
            )));
        }
        let mut value = vec![0u8; length as usize];
        self.receive(&mut value, deadline)?;
        Ok(value)
    }

    fn send(&mut self, query: &[u8], deadline: Instant) -> Result<(), Error> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.stream
            .set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .and_then(|()| self.stream.write_all(query))
            .and_then(|()| self.stream.flush())
            .map_err(|e| self.error(&e.to_string()))
    }

    /// Fills `buf`, each read waiting at most until `deadline`, so a store that sends a byte
    /// at a time cannot hold the rank past it.
    fn receive(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), Error> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.error("timed out"));
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.error(&e.to_string()))?;
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(self.error("closed the connection")),
                Ok(n) => filled += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.error("timed out"))
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.error(&e.to_string())),
            }
        }
        Ok(())
    }

    fn error(&self, what: &str) -> Error {
        Error::Distributed(format!("torchrun's store at {}: {what}", self.address))
    }
}

/// Appends a key or value as the store frames it.
fn put_bytes(query: &mut Vec<u8>, bytes: &[u8]) {
    query.extend_from_slice(&(bytes.len() as u64).to_ne_bytes());
    query.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    /// A store that, for each step, reads that many bytes and sends that reply; gives
    /// everything it read.
    fn fake_store(steps: Vec<(usize, Vec<u8>)>) -> (String, thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            for (expect, reply) in steps {
                let mut query = vec![0u8; expect];
                stream.read_exact(&mut query).unwrap();
                got.extend(query);
                stream.write_all(&reply).unwrap();
            }
            // Held open until the client is done with it.
            let _ = stream.read(&mut [0u8; 1]);
            got
        });
        (address, server)
    }

    fn soon(millis: u64) -> Instant {
        Instant::now() + Duration::from_millis(millis)
    }

    #[test]
    fn a_wait_then_a_get_are_framed_as_torch_frames_them() {
        let key = "pipecut/rendezvous/none/attempt_0";
        let validate = 5;
        let wait = 1 + 8 + 8 + key.len();
        let get = 1 + 8 + key.len();
        let mut value = 14u64.to_ne_bytes().to_vec();
        value.extend_from_slice(b"127.0.0.1:4242");
        let steps = vec![
            (validate, Vec::new()),
            (wait, vec![STOP_WAITING]),
            (get, value),
        ];
        let (address, server) = fake_store(steps);
        let mut store = TorchStore::connect(&address, soon(5000)).unwrap();
        assert_eq!(store.wait_get(key, soon(5000)).unwrap(), b"127.0.0.1:4242");
        drop(store);
        let sent = server.join().unwrap();
        assert_eq!(sent[0], VALIDATE);
        assert_eq!(sent[1..5], MAGIC.to_ne_bytes());
        assert_eq!(sent[5], WAIT);
        assert_eq!(sent[6..14], 1u64.to_ne_bytes());
        assert_eq!(sent[14..22], (key.len() as u64).to_ne_bytes());
        assert_eq!(&sent[22..22 + key.len()], key.as_bytes());
        assert_eq!(sent[22 + key.len()], GET);
    }

    #[test]
    fn a_store_that_claims_a_huge_value_is_refused_before_reading_it() {
        let steps = vec![
            (5, Vec::new()),
            (1 + 8 + 8 + 1, vec![STOP_WAITING]),
            (1 + 8 + 1, u64::MAX.to_ne_bytes().to_vec()),
        ];
        let (address, _server) = fake_store(steps);
        let mut store = TorchStore::connect(&address, soon(5000)).unwrap();
        let err = store.wait_get("k", soon(5000)).unwrap_err().to_string();
        assert!(err.contains("more than an address"), "{err}");
    }

    #[test]
    fn a_value_that_is_not_an_address_is_one_line_naming_the_store_and_key() {
        let key = "pipecut/rendezvous/none/attempt_0";
        let mut value = 6u64.to_ne_bytes().to_vec();
        value.extend_from_slice(b"\x1b[2Jno");
        let steps = vec![
            (5, Vec::new()),
            (1 + 8 + 8 + key.len(), vec![STOP_WAITING]),
            (1 + 8 + key.len(), value),
        ];
        let (store, _server) = fake_store(steps);
        let rendezvous = crate::launch::Rendezvous::TorchrunStore {
            host: "127.0.0.1".into(),
            store: store.clone(),
            key: key.into(),
        };
        let err = super::super::find_rendezvous(&rendezvous, soon(5000))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!("distributed run: torchrun's store at {store} holds {key} = \"\\u{{1b}}[2Jno\", not an address")
        );
    }

    #[test]
    fn a_store_that_never_answers_ends_at_the_deadline() {
        let (address, _server) = fake_store(vec![(5, Vec::new()), (1 + 8 + 8 + 1, Vec::new())]);
        let mut store = TorchStore::connect(&address, soon(5000)).unwrap();
        let started = Instant::now();
        let err = store.wait_get("k", soon(300)).unwrap_err().to_string();
        assert!(
            err.contains("k was not set before the peer timeout"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    }

    #[test]
    fn nothing_listening_is_one_line_at_the_deadline() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let err = TorchStore::connect(&address, soon(200))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("cannot reach torchrun's store"), "{err}");
    }
}
