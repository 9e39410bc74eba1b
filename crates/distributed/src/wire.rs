//! Tensors on the wire: a message is the named tensors one stage hands the next for one
//! micro-batch, each as the bytes of a `.npy` file, so that every dtype the runtime holds
//! (strings included) crosses unchanged and a message can be inspected with numpy.
//!
//! ```text
//! u32 count, then per tensor: u32 name length, name (UTF-8), u64 .npy length, .npy bytes
//! ```
//! All integers little-endian. Decoding never trusts a length: each is checked against the
//! bytes actually left before anything is allocated.

use std::sync::Arc;

use crate::Error;
use pipecut_runtime::{encode_npy, parse_npy, Tensors};

/// The bytes of `tensors`, in name order.
pub fn encode(tensors: &Tensors) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
    for (name, tensor) in tensors {
        let npy = encode_npy(tensor);
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(npy.len() as u64).to_le_bytes());
        out.extend_from_slice(&npy);
    }
    out
}

/// The tensors of a message made by [`encode`]; `origin` names the sender in errors.
pub fn decode(bytes: &[u8], origin: &str) -> Result<Tensors, Error> {
    let mut reader = Reader { bytes, origin };
    let count = reader.u32()?;
    let mut tensors = Tensors::new();
    for _ in 0..count {
        let name_len = reader.u32()? as usize;
        let name = std::str::from_utf8(reader.take(name_len)?)
            .map_err(|_| reader.bad("a tensor name is not UTF-8"))?
            .to_string();
        let npy_len = usize::try_from(reader.u64()?)
            .map_err(|_| reader.bad("a tensor is larger than this machine's address space"))?;
        let array = parse_npy(reader.take(npy_len)?, origin)?;
        if tensors
            .insert(name.clone(), Arc::new(array.tensor))
            .is_some()
        {
            return Err(reader.bad(&format!("tensor '{name}' is sent twice")));
        }
    }
    if !reader.bytes.is_empty() {
        return Err(reader.bad("bytes follow the last tensor"));
    }
    Ok(tensors)
}

struct Reader<'a> {
    bytes: &'a [u8],
    origin: &'a str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.bytes.len() {
            return Err(self.bad("the message is cut short"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn bad(&self, detail: &str) -> Error {
        Error::Distributed(format!(
            "a message from {} is malformed: {detail}",
            self.origin
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_runtime::{HostTensor, TensorData};

    fn sample() -> Tensors {
        let mut t = Tensors::new();
        let floats = HostTensor::new(vec![2, 2], TensorData::F32(vec![1.0, -0.0, f32::NAN, 3.5]));
        let ints = HostTensor::new(vec![3], TensorData::I64(vec![-1, 0, i64::MAX]));
        t.insert("x".into(), Arc::new(floats.unwrap()));
        t.insert("ids".into(), Arc::new(ints.unwrap()));
        t
    }

    #[test]
    fn tensors_cross_the_wire_bit_for_bit() {
        let sent = sample();
        let received = decode(&encode(&sent), "rank 0").unwrap();
        assert_eq!(received.keys().collect::<Vec<_>>(), vec!["ids", "x"]);
        let (TensorData::F32(a), TensorData::F32(b)) = (sent["x"].data(), received["x"].data())
        else {
            panic!("float tensors stay float");
        };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b));
        assert_eq!(sent["ids"], received["ids"]);
        assert_eq!(received["x"].shape(), &[2, 2]);
    }

    /// A uint8 tensor crosses as its bytes (the plan bounds messages by the declared dtype's
    /// size), and a header claiming more bytes than the message holds is refused before any
    /// buffer is made for them.
    #[test]
    fn bytes_cross_as_bytes_and_a_lying_header_is_refused() {
        let pixels = HostTensor::new(vec![1 << 20], TensorData::U8(vec![7; 1 << 20])).unwrap();
        let mut sent = Tensors::new();
        sent.insert("pixels".into(), Arc::new(pixels));
        let bytes = encode(&sent);
        assert!(bytes.len() < (1 << 20) + 256, "{} bytes", bytes.len());
        assert_eq!(decode(&bytes, "rank 0").unwrap(), sent);
        // The .npy header says 2^40 bytes follow; the message holds 1 MiB. The header's text
        // follows 10 bytes of magic, version and length; six digits more, six spaces of
        // padding fewer, it keeps its length.
        let text_at = bytes.len() - (1 << 20) - 128 + 10;
        let text = std::str::from_utf8(&bytes[text_at..text_at + 118]).unwrap();
        let lying = text
            .replace("(1048576,)", "(1099511627776,)")
            .replacen("      \n", "\n", 1);
        assert_eq!(lying.len(), text.len(), "{text:?}");
        let mut forged = bytes.clone();
        forged[text_at..text_at + 118].copy_from_slice(lying.as_bytes());
        let err = decode(&forged, "rank 0").unwrap_err().to_string();
        assert!(
            err.contains("rank 0") && err.contains("1099511627776"),
            "{err}"
        );
    }

    #[test]
    fn truncated_or_padded_messages_are_refused_naming_the_sender() {
        let bytes = encode(&sample());
        for cut in [0, 3, 9, bytes.len() - 1] {
            let err = decode(&bytes[..cut], "rank 2 (stage 1, replica 0)").unwrap_err();
            assert!(
                err.to_string().contains("rank 2 (stage 1, replica 0)"),
                "{err}"
            );
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(decode(&padded, "rank 1")
            .unwrap_err()
            .to_string()
            .contains("follow"));
        let mut huge = bytes;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge, "rank 1")
            .unwrap_err()
            .to_string()
            .contains("cut short"));
    }
}
