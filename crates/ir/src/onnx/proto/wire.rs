//! The protobuf wire format, as far as onnx.proto needs it: a bounds-checked reader with a
//! nesting limit, a writer that streams into a hash or a buffer, and the field kinds
//! ([`Kind`]) the messages in the parent module are declared with.
//!
//! Decoding follows rust-protobuf 3.4 (which pipecut used before, and whose re-encoding the
//! recorded `graph_sha256`/`weights_sha256` digests are): a known field number arriving with
//! another wire type is kept as an unknown field, a singular field seen twice keeps the last
//! value (messages too: they are replaced, not merged), repeated numbers are read packed or
//! not, strings must be UTF-8, and messages nest at most 100 deep.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// How deep messages (and groups) may nest: rust-protobuf's default limit, so every file it
/// read still reads, and a nesting bomb is an error before it can exhaust the stack.
pub const RECURSION_LIMIT: u32 = 100;

/// Why bytes are not a message of the expected type. Each names one problem in words; the
/// loader adds where the bytes came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A length-delimited field declares more bytes than its enclosing message has left.
    LengthOverrun,
    /// The bytes end inside a tag or a value.
    UnexpectedEnd,
    /// Messages or groups nested deeper than [`RECURSION_LIMIT`].
    TooDeep,
    /// A varint longer than 10 bytes or above 64 bits.
    BadVarint,
    /// A tag with field number 0 or wire type 6 or 7, or a group end with no start.
    BadTag(u64),
    /// A string field that is not UTF-8.
    NotUtf8,
    /// An `int32` field whose value does not fit 32 bits.
    Int32Overflow(i64),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LengthOverrun => f.write_str(
                "a field's declared length runs past the end of the message that holds it (truncated or corrupt file)",
            ),
            Self::UnexpectedEnd => f.write_str("the file ends in the middle of a field (truncated?)"),
            Self::TooDeep => write!(f, "messages are nested more than {RECURSION_LIMIT} levels deep"),
            Self::BadVarint => f.write_str("a variable-length integer is longer than 64 bits (corrupt file)"),
            Self::BadTag(tag) => write!(f, "invalid field tag {tag} (corrupt file)"),
            Self::NotUtf8 => f.write_str("a string field is not valid UTF-8 (corrupt file)"),
            Self::Int32Overflow(v) => write!(f, "the 32-bit integer field holds {v} (corrupt file)"),
        }
    }
}

/// Wire types (the low three bits of a tag).
pub const VARINT: u8 = 0;
pub const FIXED64: u8 = 1;
pub const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
pub const FIXED32: u8 = 5;

/// A message's bytes being read, and how deep inside the file they are.
///
/// A message that the file cuts short is still read up to the cut, as rust-protobuf read it, so
/// that a corrupt field inside is reported as such and the cut itself only when nothing else is
/// wrong: `cut` is how far the message's declared length runs past the file's end.
pub struct Reader<'a> {
    bytes: &'a [u8],
    /// Messages enclosing these bytes (0: the whole file).
    depth: u32,
    /// Bytes the message declares beyond `bytes` (the top level declares no end of its own).
    cut: usize,
}

/// What a length-delimited field's declared length finds.
enum Payload<'a> {
    Whole(&'a [u8]),
    /// The file ends inside the payload, which declares `missing` more bytes than these.
    Cut(&'a [u8], usize),
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader {
            bytes,
            depth: 0,
            cut: usize::MAX,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.bytes.len() {
            return Err(DecodeError::UnexpectedEnd);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (i, &b) in self.bytes.iter().take(10).enumerate() {
            if i == 9 && b & 0x7f > 1 {
                return Err(DecodeError::BadVarint);
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.bytes = &self.bytes[i + 1..];
                return Ok(value);
            }
        }
        Err(match self.bytes.len() < 10 {
            true => DecodeError::UnexpectedEnd,
            false => DecodeError::BadVarint,
        })
    }

    pub fn fixed32(&mut self) -> Result<u32, DecodeError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    pub fn fixed64(&mut self) -> Result<u64, DecodeError> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    /// The payload of a length-delimited field, checked against what is left before anything is
    /// allocated for it.
    pub fn len_delimited(&mut self) -> Result<&'a [u8], DecodeError> {
        match self.payload()? {
            Payload::Whole(bytes) => Ok(bytes),
            Payload::Cut(..) => Err(DecodeError::UnexpectedEnd),
        }
    }

    /// The next payload: whole, cut by the end of the file, or (an error) longer than the
    /// message that holds it.
    fn payload(&mut self) -> Result<Payload<'a>, DecodeError> {
        let len = self.varint()?;
        let available = self.bytes.len();
        if len <= available as u64 {
            return self.take(len as usize).map(Payload::Whole);
        }
        if len - available as u64 > self.cut as u64 {
            return Err(DecodeError::LengthOverrun);
        }
        let missing = (len - available as u64) as usize;
        Ok(Payload::Cut(self.take(available)?, missing))
    }

    /// How many more times field `number` comes length-delimited in these bytes, counting the
    /// one whose payload is next; the count stops at the first malformed field (decoding the
    /// message reports it). Reading the tags and lengths of a million nodes takes milliseconds.
    fn count_ahead(&self, number: u32) -> usize {
        let mut ahead = Reader { ..*self };
        let mut count = 0;
        let mut field = Some((number, LEN));
        while let Some((n, wire)) = field {
            count += usize::from(n == number && wire == LEN);
            let skipped = match wire {
                VARINT => ahead.varint().map(drop),
                FIXED64 => ahead.take(8).map(drop),
                LEN => ahead.len_delimited().map(drop),
                FIXED32 => ahead.take(4).map(drop),
                START_GROUP => ahead.skip_group(),
                _ => break,
            };
            field = match skipped {
                Ok(()) => ahead.tag().ok().flatten(),
                Err(_) => None,
            };
        }
        count
    }

    /// A reader one level deeper of `bytes`, which were just taken from this one, refused past
    /// [`RECURSION_LIMIT`].
    fn nested(&self, bytes: &'a [u8]) -> Result<Reader<'a>, DecodeError> {
        if self.depth >= RECURSION_LIMIT {
            return Err(DecodeError::TooDeep);
        }
        Ok(Reader {
            bytes,
            depth: self.depth + 1,
            cut: 0,
        })
    }

    /// The next field's number and wire type, `None` at the end of the message.
    fn tag(&mut self) -> Result<Option<(u32, u8)>, DecodeError> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let (number, wire) = (tag >> 3, (tag & 7) as u8);
        if tag > u64::from(u32::MAX) || number == 0 || wire > FIXED32 {
            return Err(DecodeError::BadTag(tag));
        }
        Ok(Some((number as u32, wire)))
    }

    /// Skips a group's fields up to its end tag (groups are proto2's and never ONNX's).
    fn skip_group(&mut self) -> Result<(), DecodeError> {
        let mut inner = self.nested(self.bytes)?;
        inner.cut = self.cut;
        loop {
            let Some((number, wire)) = inner.tag()? else {
                return Err(DecodeError::UnexpectedEnd);
            };
            if wire == END_GROUP {
                self.bytes = inner.bytes;
                return Ok(());
            }
            inner.unknown_value(number, wire)?;
        }
    }

    /// An unknown field's value; `None` for a skipped group.
    fn unknown_value(
        &mut self,
        number: u32,
        wire: u8,
    ) -> Result<Option<UnknownValue>, DecodeError> {
        Ok(Some(match wire {
            VARINT => UnknownValue::Varint(self.varint()?),
            FIXED64 => UnknownValue::Fixed64(self.fixed64()?),
            LEN => UnknownValue::Bytes(self.len_delimited()?.to_vec()),
            FIXED32 => UnknownValue::Fixed32(self.fixed32()?),
            START_GROUP => {
                self.skip_group()?;
                return Ok(None);
            }
            // A group's end with no start.
            _ => {
                return Err(DecodeError::BadTag(
                    u64::from(number) << 3 | u64::from(wire),
                ))
            }
        }))
    }
}

/// Bytes being encoded, handed on in chunks (to a hash, or to a buffer). The chunk lives on the
/// stack: a heap buffer per digest made the allocator consolidate the freed message at each one.
pub struct Writer<'a> {
    chunk: [u8; CHUNK],
    len: usize,
    drain: &'a mut dyn FnMut(&[u8]),
}

/// Bytes collected before they are handed on.
const CHUNK: usize = 8 * 1024;

impl<'a> Writer<'a> {
    /// A writer that hands its bytes to `drain`, up to 8 KiB at a time.
    pub fn streaming(drain: &'a mut dyn FnMut(&[u8])) -> Self {
        Writer {
            chunk: [0; CHUNK],
            len: 0,
            drain,
        }
    }

    fn flush(&mut self) {
        if self.len > 0 {
            (self.drain)(&self.chunk[..self.len]);
            self.len = 0;
        }
    }

    pub fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > CHUNK {
            self.flush();
            if bytes.len() > CHUNK {
                (self.drain)(bytes);
                return;
            }
        }
        self.chunk[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    pub fn varint(&mut self, mut value: u64) {
        if self.len + 10 > CHUNK {
            self.flush();
        }
        while value >= 0x80 {
            self.chunk[self.len] = (value as u8) | 0x80;
            value >>= 7;
            self.len += 1;
        }
        self.chunk[self.len] = value as u8;
        self.len += 1;
    }

    pub fn tag(&mut self, number: u32, wire: u8) {
        self.varint((u64::from(number) << 3) | u64::from(wire));
    }

    /// A length-delimited field.
    pub fn bytes_field(&mut self, number: u32, bytes: &[u8]) {
        self.tag(number, LEN);
        self.varint(bytes.len() as u64);
        self.put(bytes);
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Bytes a varint of `value` takes.
pub fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

pub fn tag_len(number: u32) -> usize {
    varint_len(u64::from(number) << 3)
}

pub fn len_delimited_len(number: u32, len: usize) -> usize {
    tag_len(number) + varint_len(len as u64) + len
}

/// A message's encoded length, kept by [`Message::encoded_len`] for the [`Message::encode`]
/// that follows (as rust-protobuf caches it), so that nested messages are measured once, not once
/// per enclosing level. Not part of the message's value: copies and comparisons ignore it.
#[derive(Default, Debug)]
pub struct CachedLen(std::cell::Cell<usize>);

impl Clone for CachedLen {
    fn clone(&self) -> Self {
        CachedLen::default()
    }
}

impl PartialEq for CachedLen {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl CachedLen {
    pub fn set(&self, len: usize) -> usize {
        self.0.set(len);
        len
    }

    pub fn get(&self) -> usize {
        self.0.get()
    }
}

/// A message of onnx.proto: its fields by number, in the order rust-protobuf writes them.
pub trait Message: Default {
    /// Reads one occurrence of field `number`; `Ok(false)` when this message has no such field
    /// or it came with another wire type (the caller then keeps it as an unknown field).
    fn merge_field(
        &mut self,
        number: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError>;
    fn unknown_fields_mut(&mut self) -> &mut UnknownFields;
    /// Bytes of the encoding, without an enclosing tag and length; kept for [`Message::encode`]
    /// with the lengths of the nested messages.
    fn encoded_len(&self) -> usize;
    /// The length the last [`Message::encoded_len`] found.
    fn cached_len(&self) -> usize;
    /// Writes the fields; the lengths of nested messages are those [`Message::encoded_len`]
    /// kept, so it must have been called since the message last changed.
    fn encode(&self, w: &mut Writer<'_>);

    /// Decodes a whole message (the top-level one: its nested messages count their depth).
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_from(&mut Reader::new(bytes))
    }

    fn decode_from(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut message = Self::default();
        while let Some((number, wire)) = r.tag()? {
            if !message.merge_field(number, wire, r)? {
                if let Some(value) = r.unknown_value(number, wire)? {
                    message.unknown_fields_mut().add(number, value);
                }
            }
        }
        Ok(message)
    }

    /// Encodes into `drain`, in chunks, without holding the whole encoding.
    fn encode_streaming(&self, drain: &mut dyn FnMut(&[u8])) {
        self.encoded_len();
        self.encode(&mut Writer::streaming(drain));
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.encoded_len());
        self.encode(&mut Writer::streaming(&mut |chunk| {
            bytes.extend_from_slice(chunk)
        }));
        bytes
    }
}

/// Decodes a message from `r` except field `number`: each time that field comes
/// length-delimited and whole, `aside` gets a reader of its payload, one level deeper, to
/// decode later (or not). Everything else merges as [`Message::decode_from`] merges it. An
/// error of `aside` ends the decoding.
pub fn decode_setting_aside<'a, M: Message>(
    r: &mut Reader<'a>,
    number: u32,
    aside: &mut dyn FnMut(Reader<'a>) -> Result<(), DecodeError>,
) -> Result<M, DecodeError> {
    let mut message = M::default();
    while let Some((field, wire)) = r.tag()? {
        if field == number && wire == LEN {
            let Payload::Whole(bytes) = r.payload()? else {
                return Err(DecodeError::UnexpectedEnd);
            };
            aside(r.nested(bytes)?)?;
            continue;
        }
        if !message.merge_field(field, wire, r)? {
            if let Some(value) = r.unknown_value(field, wire)? {
                message.unknown_fields_mut().add(field, value);
            }
        }
    }
    Ok(message)
}

/// Decodes a nested message's payload one level deeper.
/// A message the file cuts short is read up to the cut, then refused for it.
fn nested_message<M: Message>(r: &mut Reader<'_>) -> Result<M, DecodeError> {
    match r.payload()? {
        Payload::Whole(bytes) => M::decode_from(&mut r.nested(bytes)?),
        Payload::Cut(bytes, missing) => {
            let mut inner = r.nested(bytes)?;
            inner.cut = missing;
            M::decode_from(&mut inner)?;
            Err(DecodeError::UnexpectedEnd)
        }
    }
}

/// One unknown field value, as rust-protobuf keeps it.
#[derive(Clone, Debug, PartialEq)]
pub enum UnknownValue {
    Fixed32(u32),
    Fixed64(u64),
    Varint(u64),
    Bytes(Vec<u8>),
}

/// One field number's unknown values, by wire type, as rust-protobuf groups them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnknownValues {
    fixed32: Vec<u32>,
    fixed64: Vec<u64>,
    varint: Vec<u64>,
    bytes: Vec<Vec<u8>>,
}

/// Fields a message does not declare. rust-protobuf re-encodes them after the known fields,
/// number by number in the iteration order of a `HashMap` with `DefaultHasher`; the same map
/// filled in the same order iterates the same way, so the digests stay rust-protobuf's even for
/// a message with several unknown field numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnknownFields {
    // Boxed as rust-protobuf boxes it: one word in every message, which almost never has any.
    #[allow(clippy::box_collection)]
    fields: Option<Box<HashMap<u32, UnknownValues, BuildHasherDefault<DefaultHasher>>>>,
}

impl UnknownFields {
    pub fn is_empty(&self) -> bool {
        self.fields.as_ref().is_none_or(|f| f.is_empty())
    }

    fn add(&mut self, number: u32, value: UnknownValue) {
        let values = self.fields.get_or_insert_with(Default::default);
        let values = values.entry(number).or_default();
        match value {
            UnknownValue::Fixed32(v) => values.fixed32.push(v),
            UnknownValue::Fixed64(v) => values.fixed64.push(v),
            UnknownValue::Varint(v) => values.varint.push(v),
            UnknownValue::Bytes(v) => values.bytes.push(v),
        }
    }

    fn each(&self, mut f: impl FnMut(u32, UnknownRef<'_>)) {
        for (&number, values) in self.fields.iter().flat_map(|f| f.iter()) {
            values
                .fixed32
                .iter()
                .for_each(|&v| f(number, UnknownRef::Fixed32(v)));
            values
                .fixed64
                .iter()
                .for_each(|&v| f(number, UnknownRef::Fixed64(v)));
            values
                .varint
                .iter()
                .for_each(|&v| f(number, UnknownRef::Varint(v)));
            values
                .bytes
                .iter()
                .for_each(|v| f(number, UnknownRef::Bytes(v)));
        }
    }

    pub fn encoded_len(&self) -> usize {
        let mut len = 0;
        self.each(|number, value| {
            len += match value {
                UnknownRef::Fixed32(_) => tag_len(number) + 4,
                UnknownRef::Fixed64(_) => tag_len(number) + 8,
                UnknownRef::Varint(v) => tag_len(number) + varint_len(v),
                UnknownRef::Bytes(b) => len_delimited_len(number, b.len()),
            }
        });
        len
    }

    pub fn encode(&self, w: &mut Writer<'_>) {
        self.each(|number, value| match value {
            UnknownRef::Fixed32(v) => {
                w.tag(number, FIXED32);
                w.put(&v.to_le_bytes());
            }
            UnknownRef::Fixed64(v) => {
                w.tag(number, FIXED64);
                w.put(&v.to_le_bytes());
            }
            UnknownRef::Varint(v) => {
                w.tag(number, VARINT);
                w.varint(v);
            }
            UnknownRef::Bytes(b) => w.bytes_field(number, b),
        });
    }
}

enum UnknownRef<'a> {
    Fixed32(u32),
    Fixed64(u64),
    Varint(u64),
    Bytes(&'a [u8]),
}

/// How one declared field is read and written; implemented by the unit types below for the
/// Rust types they hold.
pub trait Kind<T> {
    /// Reads one occurrence of the field (`number` tells a oneof's members apart); `Ok(false)`
    /// when `wire` is not the field's wire type.
    fn merge(value: &mut T, number: u32, wire: u8, r: &mut Reader<'_>)
        -> Result<bool, DecodeError>;
    fn len(value: &T, number: u32) -> usize;
    fn encode(value: &T, number: u32, w: &mut Writer<'_>);
}

/// A numeric scalar's wire form.
pub trait Scalar: Copy + PartialEq + Default {
    const WIRE: u8;
    /// The most bytes one value takes.
    const MAX_LEN: usize;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
    fn len(self) -> usize;
    fn write(self, w: &mut Writer<'_>);
}

impl Scalar for i64 {
    const MAX_LEN: usize = 10;
    const WIRE: u8 = VARINT;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(r.varint()? as i64)
    }
    fn len(self) -> usize {
        varint_len(self as u64)
    }
    fn write(self, w: &mut Writer<'_>) {
        w.varint(self as u64)
    }
}

impl Scalar for u64 {
    const MAX_LEN: usize = 10;
    const WIRE: u8 = VARINT;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.varint()
    }
    fn len(self) -> usize {
        varint_len(self)
    }
    fn write(self, w: &mut Writer<'_>) {
        w.varint(self)
    }
}

/// `int32` and enums: a negative value is written as its 64-bit sign extension.
impl Scalar for i32 {
    const MAX_LEN: usize = 10;
    const WIRE: u8 = VARINT;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let v = r.varint()? as i64;
        i32::try_from(v).map_err(|_| DecodeError::Int32Overflow(v))
    }
    fn len(self) -> usize {
        varint_len(self as i64 as u64)
    }
    fn write(self, w: &mut Writer<'_>) {
        w.varint(self as i64 as u64)
    }
}

impl Scalar for f32 {
    const MAX_LEN: usize = 4;
    const WIRE: u8 = FIXED32;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(f32::from_bits(r.fixed32()?))
    }
    fn len(self) -> usize {
        4
    }
    fn write(self, w: &mut Writer<'_>) {
        w.put(&self.to_le_bytes())
    }
}

impl Scalar for f64 {
    const MAX_LEN: usize = 8;
    const WIRE: u8 = FIXED64;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(f64::from_bits(r.fixed64()?))
    }
    fn len(self) -> usize {
        8
    }
    fn write(self, w: &mut Writer<'_>) {
        w.put(&self.to_le_bytes())
    }
}

/// A proto3 singular number: written when it is not zero (so `-0.0` is not written either).
pub struct Single;

impl<T: Scalar> Kind<T> for Single {
    fn merge(value: &mut T, _: u32, wire: u8, r: &mut Reader<'_>) -> Result<bool, DecodeError> {
        if wire != T::WIRE {
            return Ok(false);
        }
        *value = T::read(r)?;
        Ok(true)
    }
    fn len(value: &T, number: u32) -> usize {
        match *value == T::default() {
            true => 0,
            false => tag_len(number) + value.len(),
        }
    }
    fn encode(value: &T, number: u32, w: &mut Writer<'_>) {
        if *value != T::default() {
            w.tag(number, T::WIRE);
            value.write(w);
        }
    }
}

/// Reads a repeated number in either form: one value, or a packed run of them.
fn merge_numbers<T: Scalar>(
    values: &mut Vec<T>,
    wire: u8,
    r: &mut Reader<'_>,
) -> Result<bool, DecodeError> {
    if wire == T::WIRE {
        values.push(T::read(r)?);
        return Ok(true);
    }
    if wire != LEN {
        return Ok(false);
    }
    let mut packed = Reader::new(r.len_delimited()?);
    // At least this many values follow, so the reservation never exceeds what the file holds.
    values.reserve(packed.bytes.len() / T::MAX_LEN);
    while !packed.bytes.is_empty() {
        values.push(T::read(&mut packed)?);
    }
    Ok(true)
}

/// A repeated number written one tag per value (onnx.proto's fields without `[packed = true]`,
/// as rust-protobuf's generated code writes them).
pub struct Repeated;

impl<T: Scalar> Kind<Vec<T>> for Repeated {
    fn merge(
        values: &mut Vec<T>,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        merge_numbers(values, wire, r)
    }
    fn len(values: &Vec<T>, number: u32) -> usize {
        values.iter().map(|v| tag_len(number) + v.len()).sum()
    }
    fn encode(values: &Vec<T>, number: u32, w: &mut Writer<'_>) {
        for v in values {
            w.tag(number, T::WIRE);
            v.write(w);
        }
    }
}

/// A repeated number written as one packed run (`[packed = true]`), nothing when empty.
pub struct Packed;

fn packed_payload_len<T: Scalar>(values: &[T]) -> usize {
    values.iter().map(|v| v.len()).sum()
}

impl<T: Scalar> Kind<Vec<T>> for Packed {
    fn merge(
        values: &mut Vec<T>,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        merge_numbers(values, wire, r)
    }
    fn len(values: &Vec<T>, number: u32) -> usize {
        match values.is_empty() {
            true => 0,
            false => len_delimited_len(number, packed_payload_len(values)),
        }
    }
    fn encode(values: &Vec<T>, number: u32, w: &mut Writer<'_>) {
        if values.is_empty() {
            return;
        }
        w.tag(number, LEN);
        w.varint(packed_payload_len(values) as u64);
        values.iter().for_each(|v| v.write(w));
    }
}

/// A `string` (UTF-8, checked) or, as `Vec<String>`, a repeated one.
pub struct Str;

fn read_string(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    let bytes = r.len_delimited()?;
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| DecodeError::NotUtf8)
}

impl Kind<String> for Str {
    fn merge(
        value: &mut String,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        if wire != LEN {
            return Ok(false);
        }
        *value = read_string(r)?;
        Ok(true)
    }
    fn len(value: &String, number: u32) -> usize {
        bytes_len(value.as_bytes(), number)
    }
    fn encode(value: &String, number: u32, w: &mut Writer<'_>) {
        encode_bytes(value.as_bytes(), number, w)
    }
}

impl Kind<Vec<String>> for Str {
    fn merge(
        values: &mut Vec<String>,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        if wire != LEN {
            return Ok(false);
        }
        values.push(read_string(r)?);
        Ok(true)
    }
    fn len(values: &Vec<String>, number: u32) -> usize {
        values
            .iter()
            .map(|v| len_delimited_len(number, v.len()))
            .sum()
    }
    fn encode(values: &Vec<String>, number: u32, w: &mut Writer<'_>) {
        values
            .iter()
            .for_each(|v| w.bytes_field(number, v.as_bytes()));
    }
}

/// `bytes`, singular (written when not empty) or repeated.
pub struct Bytes;

fn bytes_len(value: &[u8], number: u32) -> usize {
    match value.is_empty() {
        true => 0,
        false => len_delimited_len(number, value.len()),
    }
}

fn encode_bytes(value: &[u8], number: u32, w: &mut Writer<'_>) {
    if !value.is_empty() {
        w.bytes_field(number, value);
    }
}

impl Kind<Vec<u8>> for Bytes {
    fn merge(
        value: &mut Vec<u8>,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        if wire != LEN {
            return Ok(false);
        }
        *value = r.len_delimited()?.to_vec();
        Ok(true)
    }
    fn len(value: &Vec<u8>, number: u32) -> usize {
        bytes_len(value, number)
    }
    fn encode(value: &Vec<u8>, number: u32, w: &mut Writer<'_>) {
        encode_bytes(value, number, w)
    }
}

impl Kind<Vec<Vec<u8>>> for Bytes {
    fn merge(
        values: &mut Vec<Vec<u8>>,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        if wire != LEN {
            return Ok(false);
        }
        values.push(r.len_delimited()?.to_vec());
        Ok(true)
    }
    fn len(values: &Vec<Vec<u8>>, number: u32) -> usize {
        values
            .iter()
            .map(|v| len_delimited_len(number, v.len()))
            .sum()
    }
    fn encode(values: &Vec<Vec<u8>>, number: u32, w: &mut Writer<'_>) {
        values.iter().for_each(|v| w.bytes_field(number, v));
    }
}

/// A nested message: singular (`Option<Box<M>>`, written when present, even empty) or
/// repeated (`Vec<M>`).
pub struct Msg;

/// Writes `message` as field `number`, with the length its `encoded_len` kept.
pub fn encode_message<M: Message>(message: &M, number: u32, w: &mut Writer<'_>) {
    w.tag(number, LEN);
    w.varint(message.cached_len() as u64);
    message.encode(w);
}

/// Streams each message's encoding into `drain`, each prefixed with its length in bytes as a
/// little-endian u64.
pub fn length_prefixed_stream<M: Message>(messages: &[M], drain: &mut dyn FnMut(&[u8])) {
    let mut w = Writer::streaming(drain);
    for message in messages {
        w.put(&(message.encoded_len() as u64).to_le_bytes());
        message.encode(&mut w);
    }
}

pub fn message_len<M: Message>(message: &M, number: u32) -> usize {
    len_delimited_len(number, message.encoded_len())
}

/// Reads field `number`'s message when it came length-delimited.
pub fn read_message<M: Message>(wire: u8, r: &mut Reader<'_>) -> Result<Option<M>, DecodeError> {
    match wire {
        LEN => nested_message(r).map(Some),
        _ => Ok(None),
    }
}

impl<M: Message> Kind<Option<Box<M>>> for Msg {
    fn merge(
        value: &mut Option<Box<M>>,
        _: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        let Some(message) = read_message(wire, r)? else {
            return Ok(false);
        };
        *value = Some(Box::new(message));
        Ok(true)
    }
    fn len(value: &Option<Box<M>>, number: u32) -> usize {
        value
            .as_ref()
            .map_or(0, |m| message_len(m.as_ref(), number))
    }
    fn encode(value: &Option<Box<M>>, number: u32, w: &mut Writer<'_>) {
        if let Some(m) = value {
            encode_message(m.as_ref(), number, w);
        }
    }
}

/// Bytes a message must have left before a repeated message field's first element counts the
/// rest and reserves their room: the graph's lists of nodes and initializers, not a node's own
/// small lists (counting them would cost more than their growth).
pub(super) const RESERVE_AHEAD_BYTES: usize = 1 << 20;

impl<M: Message> Kind<Vec<M>> for Msg {
    fn merge(
        values: &mut Vec<M>,
        number: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, DecodeError> {
        // A million nodes grown by doubling were copied twice over and their pages touched
        // three times (about 300 MB of `NodeProto`s at the end).
        if wire == LEN && values.capacity() == 0 && r.bytes.len() >= RESERVE_AHEAD_BYTES {
            values.reserve_exact(r.count_ahead(number));
        }
        let Some(message) = read_message(wire, r)? else {
            return Ok(false);
        };
        values.push(message);
        Ok(true)
    }
    fn len(values: &Vec<M>, number: u32) -> usize {
        values.iter().map(|m| message_len(m, number)).sum()
    }
    fn encode(values: &Vec<M>, number: u32, w: &mut Writer<'_>) {
        values.iter().for_each(|m| encode_message(m, number, w));
    }
}
