//! Mutations: raw bytes (flips, interesting values, insertions, deletions, splices), protobuf
//! wire format (decoded into a field tree, one field changed, lengths re-encoded so the change
//! reaches the decoder's later stages), and JSON (a value of the document replaced).

use serde_json::Value;

/// xorshift64*: small, fast, and reproducible from a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers at the edges where size arithmetic breaks: zero, small counts, powers of two and
/// their neighbours, the signed and unsigned extremes.
const INTERESTING: [u64; 24] = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    64,
    127,
    128,
    255,
    256,
    65_535,
    65_536,
    (1 << 31) - 1,
    1 << 31,
    1 << 32,
    1 << 40,
    1 << 62,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
    u64::MAX - 1,
];

fn interesting(rng: &mut Rng) -> u64 {
    *rng.pick(&INTERESTING)
}

/// One byte-level mutation, in place. `others` are inputs to splice from.
pub fn mutate_bytes(data: &mut Vec<u8>, rng: &mut Rng, others: &[Vec<u8>], max_len: usize) {
    if data.is_empty() {
        data.extend((0..1 + rng.below(8)).map(|_| rng.next() as u8));
        return;
    }
    let len = data.len();
    match rng.below(10) {
        0 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        1 => {
            let at = rng.below(len);
            data[at] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'-', b'0', b'9']);
        }
        2 => {
            // An interesting integer, little-endian, 1 to 8 bytes wide.
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            let at = rng.below(len);
            let bytes = interesting(rng).to_le_bytes();
            for (i, b) in bytes.iter().take(width).enumerate() {
                if at + i < len {
                    data[at + i] = *b;
                }
            }
        }
        3 => {
            let at = rng.below(len + 1);
            let count = 1 + rng.below(16);
            let insert: Vec<u8> = (0..count).map(|_| rng.next() as u8).collect();
            data.splice(at..at, insert);
        }
        4 => {
            let at = rng.below(len);
            let count = 1 + rng.below((len - at).min(64));
            data.drain(at..at + count);
        }
        5 => {
            let from = rng.below(len);
            let count = 1 + rng.below((len - from).min(256));
            let chunk = data[from..from + count].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, chunk);
        }
        6 => data.truncate(rng.below(len)),
        7 => {
            // A varint of an interesting value at a random offset.
            let at = rng.below(len);
            let mut varint = Vec::new();
            encode_varint(interesting(rng), &mut varint);
            let end = (at + 1 + rng.below(3)).min(len);
            data.splice(at..end, varint);
        }
        8 if !others.is_empty() => {
            let other = rng.pick(others);
            if !other.is_empty() {
                let from = rng.below(other.len());
                let count = 1 + rng.below((other.len() - from).min(512));
                let at = rng.below(len + 1);
                data.splice(at..at, other[from..from + count].iter().copied());
            }
        }
        _ => {
            let a = rng.below(len);
            let b = rng.below(len);
            data.swap(a, b);
        }
    }
    data.truncate(max_len);
}

// ------------------------------------------------------------------------------------------
// Protobuf wire format
// ------------------------------------------------------------------------------------------

enum Payload {
    Varint(u64),
    Fixed64([u8; 8]),
    Fixed32([u8; 4]),
    Bytes(Vec<u8>),
    Message(Vec<Field>),
}

struct Field {
    number: u64,
    payload: Payload,
}

fn encode_varint(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn decode_varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Decodes a message; length-delimited fields that decode as messages become sub-trees (a
/// guess, as the wire format does not say), the rest stay bytes.
fn parse_message(data: &[u8], depth: usize) -> Option<Vec<Field>> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let key = decode_varint(data, &mut at)?;
        let number = key >> 3;
        if number == 0 {
            return None;
        }
        let payload = match key & 7 {
            0 => Payload::Varint(decode_varint(data, &mut at)?),
            1 => {
                let bytes = data.get(at..at + 8)?.try_into().ok()?;
                at += 8;
                Payload::Fixed64(bytes)
            }
            5 => {
                let bytes = data.get(at..at + 4)?.try_into().ok()?;
                at += 4;
                Payload::Fixed32(bytes)
            }
            2 => {
                let len = decode_varint(data, &mut at)? as usize;
                let body = data.get(at..at.checked_add(len)?)?;
                at += len;
                match (depth < 40 && !body.is_empty())
                    .then(|| parse_message(body, depth + 1))
                    .flatten()
                {
                    Some(sub) => Payload::Message(sub),
                    None => Payload::Bytes(body.to_vec()),
                }
            }
            _ => return None,
        };
        fields.push(Field { number, payload });
    }
    Some(fields)
}

fn write_message(fields: &[Field], out: &mut Vec<u8>) {
    for field in fields {
        let wire = match field.payload {
            Payload::Varint(_) => 0,
            Payload::Fixed64(_) => 1,
            Payload::Fixed32(_) => 5,
            Payload::Bytes(_) | Payload::Message(_) => 2,
        };
        encode_varint(field.number << 3 | wire, out);
        match &field.payload {
            Payload::Varint(v) => encode_varint(*v, out),
            Payload::Fixed64(b) => out.extend_from_slice(b),
            Payload::Fixed32(b) => out.extend_from_slice(b),
            Payload::Bytes(b) => {
                encode_varint(b.len() as u64, out);
                out.extend_from_slice(b);
            }
            Payload::Message(sub) => {
                let mut body = Vec::new();
                write_message(sub, &mut body);
                encode_varint(body.len() as u64, out);
                out.extend_from_slice(&body);
            }
        }
    }
}

/// Counts the fields of a tree, to pick one uniformly.
fn count_fields(fields: &[Field]) -> usize {
    fields
        .iter()
        .map(|f| {
            1 + match &f.payload {
                Payload::Message(sub) => count_fields(sub),
                _ => 0,
            }
        })
        .sum()
}

/// Applies `edit` to the message holding the `target`-th field (pre-order) and that field's
/// index in it. Returns false when `target` is past the end.
fn with_field(
    fields: &mut Vec<Field>,
    target: &mut usize,
    edit: &mut dyn FnMut(&mut Vec<Field>, usize),
) -> bool {
    for i in 0..fields.len() {
        if *target == 0 {
            edit(fields, i);
            return true;
        }
        *target -= 1;
        if let Payload::Message(sub) = &mut fields[i].payload {
            if with_field(sub, target, edit) {
                return true;
            }
        }
    }
    false
}

/// Strings worth writing into a model: op types, names and keys found in the seeds.
pub fn harvest_strings(data: &[u8], out: &mut Vec<Vec<u8>>) {
    fn walk(fields: &[Field], out: &mut Vec<Vec<u8>>) {
        for f in fields {
            match &f.payload {
                Payload::Bytes(b)
                    if !b.is_empty()
                        && b.len() <= 48
                        && b.iter().all(|c| c.is_ascii_graphic())
                        && !out.contains(b)
                        && out.len() < 4096 =>
                {
                    out.push(b.clone());
                }
                Payload::Message(sub) => walk(sub, out),
                _ => {}
            }
        }
    }
    if let Some(fields) = parse_message(data, 0) {
        walk(&fields, out);
    }
}

/// One protobuf-aware mutation; `None` when the input does not decode as a message.
pub fn mutate_protobuf(data: &[u8], rng: &mut Rng, dictionary: &[Vec<u8>]) -> Option<Vec<u8>> {
    let mut fields = parse_message(data, 0)?;
    let total = count_fields(&fields);
    if total == 0 {
        return None;
    }
    let mut target = rng.below(total);
    let choice = rng.below(8);
    let mut edit = |message: &mut Vec<Field>, i: usize| match choice {
        0 => {
            message.remove(i);
        }
        1 => {
            // Duplicate a field (a repeated entry twice, or a second value for a scalar).
            let mut copy = Vec::new();
            write_message(std::slice::from_ref(&message[i]), &mut copy);
            if let Some(mut parsed) = parse_message(&copy, 0) {
                let at = rng.below(message.len() + 1);
                message.insert(at, parsed.remove(0));
            }
        }
        2 | 3 => {
            message[i].payload = match &message[i].payload {
                Payload::Varint(_) | Payload::Fixed64(_) | Payload::Fixed32(_) => {
                    let value = interesting(rng);
                    // Negative values too: an int64 of -1 is u64::MAX on the wire.
                    Payload::Varint(if rng.chance(3) {
                        value.wrapping_neg()
                    } else {
                        value
                    })
                }
                Payload::Bytes(b) => {
                    let mut b = b.clone();
                    mutate_bytes(&mut b, rng, &[], 1 << 20);
                    Payload::Bytes(b)
                }
                Payload::Message(_) if !dictionary.is_empty() => {
                    Payload::Bytes(rng.pick(dictionary).clone())
                }
                Payload::Message(_) => Payload::Bytes(Vec::new()),
            }
        }
        4 if !dictionary.is_empty() => {
            // A name, op type or key from elsewhere: rewires edges, swaps ops.
            if !matches!(message[i].payload, Payload::Message(_)) || rng.chance(4) {
                message[i].payload = Payload::Bytes(rng.pick(dictionary).clone());
            }
        }
        5 => {
            let j = rng.below(message.len());
            message.swap(i, j);
        }
        6 => {
            // The same field number with a small varint: an enum or a count set anew.
            message[i].payload = Payload::Varint(rng.below(32) as u64);
        }
        _ => {
            // Renumber a field: a dims entry becomes a data entry, an input an output...
            message[i].number = 1 + rng.below(16) as u64;
        }
    };
    with_field(&mut fields, &mut target, &mut edit);
    let mut out = Vec::new();
    write_message(&fields, &mut out);
    Some(out)
}

// ------------------------------------------------------------------------------------------
// JSON
// ------------------------------------------------------------------------------------------

fn count_values(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_values).sum(),
        Value::Object(map) => map.values().map(count_values).sum(),
        _ => 0,
    }
}

fn nth_value<'a>(value: &'a mut Value, target: &mut usize) -> Option<&'a mut Value> {
    if *target == 0 {
        return Some(value);
    }
    *target -= 1;
    match value {
        Value::Array(items) => items.iter_mut().find_map(|v| nth_value(v, target)),
        Value::Object(map) => map.values_mut().find_map(|v| nth_value(v, target)),
        _ => None,
    }
}

/// Strings and keys found in JSON seeds.
pub fn harvest_json(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) if s.len() <= 64 && !out.contains(s) && out.len() < 4096 => {
            out.push(s.clone())
        }
        Value::Array(items) => items.iter().for_each(|v| harvest_json(v, out)),
        Value::Object(map) => {
            for (k, v) in map {
                if !out.contains(k) && out.len() < 4096 {
                    out.push(k.clone());
                }
                harvest_json(v, out);
            }
        }
        _ => {}
    }
}

/// One structural JSON mutation; `None` when the input is not JSON.
pub fn mutate_json(data: &[u8], rng: &mut Rng, dictionary: &[String]) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(data).ok()?;
    let total = count_values(&doc);
    if rng.chance(9) {
        // Copy a subtree over another one.
        let copy = nth_value(&mut doc, &mut rng.below(total))?.clone();
        *nth_value(&mut doc, &mut rng.below(total))? = copy;
        return serde_json::to_vec(&doc).ok();
    }
    let node = nth_value(&mut doc, &mut rng.below(total))?;
    let word = || -> Value {
        match dictionary.is_empty() {
            true => Value::String(String::new()),
            false => Value::String(dictionary[0].clone()),
        }
    };
    match rng.below(9) {
        0 => {
            let v = interesting(rng);
            *node = match rng.below(4) {
                0 => serde_json::json!(v),
                1 => serde_json::json!((v as i64).wrapping_neg()),
                2 => serde_json::json!(v as f64 * 1.5),
                _ => serde_json::json!(*rng.pick(&[0.0, -0.0, 1e-300, 1e300, 0.5, 1.0, -1.0])),
            }
        }
        1 if !dictionary.is_empty() => {
            *node = Value::String(rng.pick(dictionary).clone());
        }
        2 => {
            *node = match rng.below(5) {
                0 => Value::Null,
                1 => Value::Array(Vec::new()),
                2 => Value::Object(Default::default()),
                3 => Value::Bool(rng.chance(2)),
                _ => word(),
            }
        }
        3 => match node {
            Value::Array(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                items.remove(i);
            }
            Value::Object(map) if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).cloned().unwrap();
                map.remove(&key);
            }
            _ => *node = Value::Null,
        },
        4 => match node {
            Value::Array(items) if !items.is_empty() => {
                let item = items[rng.below(items.len())].clone();
                let count = if rng.chance(8) { 1 + rng.below(64) } else { 1 };
                for _ in 0..count {
                    items.insert(rng.below(items.len() + 1), item.clone());
                }
            }
            Value::Object(map) if !dictionary.is_empty() => {
                map.insert(
                    rng.pick(dictionary).clone(),
                    serde_json::json!(interesting(rng)),
                );
            }
            _ => {}
        },
        5 => {
            if let Value::Array(items) = node {
                if items.len() > 1 {
                    let (a, b) = (rng.below(items.len()), rng.below(items.len()));
                    items.swap(a, b);
                }
            }
        }
        6 => {
            if let Value::String(s) = node {
                let mut bytes = s.clone().into_bytes();
                mutate_bytes(&mut bytes, rng, &[], 4096);
                *s = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        _ => {
            if let Value::Number(n) = node {
                let v = n.as_f64().unwrap_or(0.0);
                *node = serde_json::json!(*rng.pick(&[v + 1.0, v - 1.0, v * 2.0, -v, v / 3.0]));
            }
        }
    }
    Some(if rng.chance(2) {
        serde_json::to_vec_pretty(&doc).ok()?
    } else {
        serde_json::to_vec(&doc).ok()?
    })
}
