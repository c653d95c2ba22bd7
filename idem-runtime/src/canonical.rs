//! Canonical JSON (RFC 8785, JCS) written straight from any `serde::Serialize` value.
//!
//! Fingerprints and key parts must not depend on field order, map order, whitespace or the
//! `serde_json/preserve_order` feature, so idem never hashes the output of `serde_json`. This
//! serializer writes the JCS form directly:
//!
//! - object members sorted by the UTF-16 code units of their names, no whitespace;
//! - strings escaped as ECMAScript's `JSON.stringify` does (only `"`, `\` and control characters);
//! - floating-point numbers in ECMAScript's shortest form (`4.50` → `4.5`, `1E30` → `1e+30`).
//!
//! One deliberate strictness beyond JCS: integers are written exactly, in full, instead of being
//! rounded through an IEEE double. Two different `u64` amounts above 2^53 therefore never share a
//! fingerprint. Below 2^53 the output is identical to JCS. Non-finite floats (`NaN`, `inf`) and
//! non-string map keys other than integers are errors: they have no JSON form.
//!
//! The output does not depend on which features another crate turned on in `serde_json`: with
//! `arbitrary_precision`, a `serde_json::Number` serializes as a private struct holding its text,
//! which is read back here and written as `serde_json` would without the feature (integers that
//! fit `u64`/`i64` exactly, other numbers as the nearest double in ECMAScript's form); a
//! `serde_json::value::RawValue` is parsed and written canonical, not hashed as its text.
//!
//! | value | canonical form |
//! |---|---|
//! | integers, `u128`/`i128` included | exact decimal digits |
//! | `f32`/`f64` | ECMAScript's shortest form; `NaN` and infinities are [`CanonicalError::NonFiniteNumber`] |
//! | bytes (`serialize_bytes`) | an array of numbers, as `serde_json` writes them |
//! | map keys | strings as they are; integers and chars as their text; anything else [`CanonicalError::NonStringKey`] |
//! | newtype structs, untagged enums | their content; newtype variants `{"Variant": value}` |
//! | `#[serde(flatten)]` | members of the enclosing object; a name twice is [`CanonicalError::DuplicateMember`] |

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::ops::Range;

use serde::ser::{self, Serialize};

/// Why a value has no canonical JSON form.
///
/// The message never contains the value itself: arguments can carry keys or personal data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// A float was `NaN` or infinite; JSON has no such number.
    #[error("a floating-point value is NaN or infinite, which has no JSON form")]
    NonFiniteNumber,
    /// A map key serialized to something other than a string or an integer.
    #[error("a map key is not a string or an integer, which has no JSON form")]
    NonStringKey,
    /// An object has the same member name twice (for example through `#[serde(flatten)]`).
    #[error("an object has the member `{0}` twice")]
    DuplicateMember(String),
    /// The value's own `Serialize` implementation failed.
    #[error("the value's Serialize implementation failed: {0}")]
    Custom(String),
    /// The arguments' canonical JSON is larger than idem fingerprints.
    #[error("the arguments are {size} bytes as canonical JSON, over the limit of {limit}")]
    TooLarge {
        /// Their size in bytes.
        size: usize,
        /// The limit ([`Idem::max_argument_bytes`](crate::Idem::max_argument_bytes)).
        limit: usize,
    },
}

impl ser::Error for CanonicalError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CanonicalError::Custom(msg.to_string())
    }
}

/// Writes the canonical JSON of `value`, leaving out the members named by `skip`.
///
/// Each entry of `skip` is a path of member names from the top of `value`
/// (`["sent_at"]`, `["req", "trace_id"]`); a path that names nothing is ignored.
pub fn to_canonical_json<T: Serialize + ?Sized>(
    value: &T,
    skip: &[&[&str]],
) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::with_capacity(64);
    write_canonical(&mut out, value, skip)?;
    Ok(out)
}

/// Appends the canonical JSON of `value` to `out`.
pub(crate) fn write_canonical<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    skip: &[&[&str]],
) -> Result<(), CanonicalError> {
    value.serialize(Canon { out, skip })
}

/// An object under construction: members are written, unsorted, into one buffer, then the
/// object is written sorted.
///
/// Used by the serializer for structs and maps, and by the fingerprint builder for the
/// argument list of a tool.
#[derive(Default)]
pub(crate) struct Members {
    values: Vec<u8>,
    entries: Vec<(Cow<'static, str>, Range<usize>)>,
}

thread_local! {
    /// Member lists whose object was written, kept (emptied) for the next objects of this
    /// thread: fingerprinting a call's arguments, nested structs included, then allocates
    /// nothing once the thread has fingerprinted a call like it.
    static SPARE: RefCell<Vec<Members>> = const { RefCell::new(Vec::new()) };
}

/// How many emptied member lists a thread keeps: one for each level of nesting.
const SPARE_LISTS: usize = 8;
/// A list whose values took more than this is freed, not kept.
const SPARE_BYTES: usize = 16 * 1024;

impl Members {
    /// Room for `n` members whose values (and, for [`object`](Members::object), the object
    /// written behind them) take `bytes`: a list this thread finished with, if it kept one.
    pub(crate) fn reused(n: usize, bytes: usize) -> Self {
        let spare = SPARE.try_with(|spare| spare.borrow_mut().pop());
        spare.ok().flatten().unwrap_or_else(|| Members {
            values: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(n),
        })
    }

    /// Empties the list and keeps it for the thread's next object (see [`Members::reused`]).
    pub(crate) fn recycle(mut self) {
        if self.values.capacity() > SPARE_BYTES {
            return;
        }
        self.values.clear();
        self.entries.clear();
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < SPARE_LISTS {
                spare.push(self);
            }
        });
    }

    /// Adds member `name` with the canonical JSON of `value`, unless `skip` leaves it out.
    /// `skip` paths start at this object.
    pub(crate) fn add<T: Serialize + ?Sized>(
        &mut self,
        name: Cow<'static, str>,
        value: &T,
        skip: &[&[&str]],
    ) -> Result<(), CanonicalError> {
        if skip.is_empty() {
            return self.add_unskipped(name, value, &[]);
        }
        if skip.iter().any(|path| path.len() == 1 && path[0] == name) {
            return Ok(());
        }
        let below: Vec<&[&str]> = skip
            .iter()
            .filter(|path| path.len() > 1 && path[0] == name)
            .map(|path| &path[1..])
            .collect();
        self.add_unskipped(name, value, &below)
    }

    fn add_unskipped<T: Serialize + ?Sized>(
        &mut self,
        name: Cow<'static, str>,
        value: &T,
        skip_below: &[&[&str]],
    ) -> Result<(), CanonicalError> {
        let start = self.values.len();
        write_canonical(&mut self.values, value, skip_below)?;
        self.entries.push((name, start..self.values.len()));
        Ok(())
    }

    /// Writes `{"a":…,"b":…}` with members in JCS order, and keeps the list for reuse.
    pub(crate) fn write_to(mut self, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
        self.sort()?;
        write_object(out, &self.entries, |out, value| {
            out.extend_from_slice(&self.values[value]);
        });
        self.recycle();
        Ok(())
    }

    /// The object alone, `{"a":…,"b":…}` with members in JCS order, written behind the member
    /// values in their own buffer rather than into a second one.
    pub(crate) fn object(&mut self) -> Result<&[u8], CanonicalError> {
        self.sort()?;
        let values = self.values.len();
        write_object(&mut self.values, &self.entries, |out, value| {
            out.extend_from_within(value);
        });
        Ok(&self.values[values..])
    }

    /// Puts the members in JCS order; a name given twice is an error.
    fn sort(&mut self) -> Result<(), CanonicalError> {
        self.entries.sort_by(|a, b| compare_utf16(&a.0, &b.0));
        if let Some(pair) = self.entries.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CanonicalError::DuplicateMember(pair[0].0.to_string()));
        }
        Ok(())
    }
}

/// Writes the object of `entries`, in their order; `value` copies a member's value (a range of
/// the members' buffer) to `out`.
fn write_object(
    out: &mut Vec<u8>,
    entries: &[(Cow<'static, str>, Range<usize>)],
    mut value: impl FnMut(&mut Vec<u8>, Range<usize>),
) {
    out.push(b'{');
    for (i, (name, range)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, name);
        out.push(b':');
        value(out, range.clone());
    }
    out.push(b'}');
}

/// JCS orders member names by their UTF-16 code units, which differs from byte order only for
/// characters outside the Basic Multilingual Plane. So the bytes decide wherever the first
/// difference is an ASCII byte (an ASCII character against another, or against the lead byte of
/// a longer one, which is larger in both orders); UTF-16 is compared only past a difference
/// between two non-ASCII bytes.
fn compare_utf16(a: &str, b: &str) -> std::cmp::Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) if x[i] < 0x80 || y[i] < 0x80 => x[i].cmp(&y[i]),
        Some(_) => a.encode_utf16().cmp(b.encode_utf16()),
    }
}

/// Escapes a string as ECMAScript's `JSON.stringify` does.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Most strings (ids, names, amounts) need no escape at all.
    if !bytes.iter().any(|&b| ESCAPED[usize::from(b)]) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The bytes a JSON string escapes: control characters, `"` and `\`.
const ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

struct Canon<'a, 's> {
    out: &'a mut Vec<u8>,
    skip: &'s [&'s [&'s str]],
}

impl Canon<'_, '_> {
    fn write_integer(self, v: impl itoa::Integer) -> Result<(), CanonicalError> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        Ok(())
    }

    fn write_float(self, v: impl ryu_js::Float + Copy, finite: bool) -> Result<(), CanonicalError> {
        if !finite {
            return Err(CanonicalError::NonFiniteNumber);
        }
        self.out
            .extend_from_slice(ryu_js::Buffer::new().format_finite(v).as_bytes());
        Ok(())
    }

    /// Opens `{"variant":` for the externally tagged enum forms; the caller closes it.
    fn open_variant(out: &mut Vec<u8>, variant: &str) {
        out.push(b'{');
        write_str(out, variant);
        out.push(b':');
    }
}

impl<'a, 's> ser::Serializer for Canon<'a, 's> {
    type Ok = ();
    type Error = CanonicalError;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a, 's>;
    type SerializeStruct = Object<'a, 's>;
    type SerializeStructVariant = Object<'a, 's>;

    fn serialize_bool(self, v: bool) -> Result<(), CanonicalError> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), CanonicalError> {
        self.write_integer(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), CanonicalError> {
        self.write_float(v, v.is_finite())
    }
    fn serialize_f64(self, v: f64) -> Result<(), CanonicalError> {
        self.write_float(v, v.is_finite())
    }
    fn serialize_char(self, v: char) -> Result<(), CanonicalError> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), CanonicalError> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), CanonicalError> {
        use ser::SerializeSeq;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for b in v {
            seq.serialize_element(b)?;
        }
        seq.end()
    }
    fn serialize_none(self) -> Result<(), CanonicalError> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), CanonicalError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), CanonicalError> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), CanonicalError> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), CanonicalError> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        Canon::open_variant(self.out, variant);
        value.serialize(Canon {
            out: &mut *self.out,
            skip: &[],
        })?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, CanonicalError> {
        self.out.push(b'[');
        Ok(Seq {
            out: self.out,
            first: true,
            close_variant: false,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a>, CanonicalError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Seq<'a>, CanonicalError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, CanonicalError> {
        Canon::open_variant(self.out, variant);
        self.out.push(b'[');
        Ok(Seq {
            out: self.out,
            first: true,
            close_variant: true,
        })
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Object<'a, 's>, CanonicalError> {
        Ok(Object {
            out: self.out,
            skip: self.skip,
            members: Members::reused(len.unwrap_or(0), len.unwrap_or(0) * 16),
            pending_key: None,
            close_variant: false,
            special: None,
        })
    }
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Object<'a, 's>, CanonicalError> {
        let special = Special::of(name);
        Ok(Object {
            out: self.out,
            skip: self.skip,
            members: match special {
                Some(_) => Members::default(),
                None => Members::reused(len, len * 16),
            },
            pending_key: None,
            close_variant: false,
            special,
        })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Object<'a, 's>, CanonicalError> {
        Canon::open_variant(self.out, variant);
        Ok(Object {
            out: self.out,
            skip: &[],
            members: Members::reused(len, len * 16),
            pending_key: None,
            close_variant: true,
            special: None,
        })
    }
}

struct Seq<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
    close_variant: bool,
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        value.serialize(Canon {
            out: &mut *self.out,
            skip: &[],
        })
    }

    fn finish(self) -> Result<(), CanonicalError> {
        self.out.push(b']');
        if self.close_variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CanonicalError> {
        self.element(v)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CanonicalError> {
        self.element(v)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CanonicalError> {
        self.element(v)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CanonicalError> {
        self.element(v)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

struct Object<'a, 's> {
    out: &'a mut Vec<u8>,
    skip: &'s [&'s [&'s str]],
    members: Members,
    pending_key: Option<String>,
    close_variant: bool,
    /// A `serde_json` private struct that stands for a number or a raw value.
    special: Option<Special>,
}

/// The private structs `serde_json` serializes some values as (its `arbitrary_precision` and
/// `raw_value` features): one field, named as the struct, holding JSON text.
#[derive(Clone, Copy)]
enum Special {
    Number,
    Raw,
}

impl Special {
    const NUMBER: &'static str = "$serde_json::private::Number";
    const RAW: &'static str = "$serde_json::private::RawValue";

    fn of(name: &str) -> Option<Special> {
        if !name.starts_with('$') {
            return None;
        }
        match name {
            Special::NUMBER => Some(Special::Number),
            Special::RAW => Some(Special::Raw),
            _ => None,
        }
    }

    /// Writes the canonical form of `text`, the JSON text the struct holds.
    fn write(self, out: &mut Vec<u8>, text: &str, skip: &[&[&str]]) -> Result<(), CanonicalError> {
        match self {
            Special::Number => write_number_text(out, text),
            Special::Raw => {
                let value: serde_json::Value = serde_json::from_str(text)
                    .map_err(|_| CanonicalError::Custom("a raw JSON value is not JSON".into()))?;
                write_canonical(out, &value, skip)
            }
        }
    }
}

/// A JSON number's text, written as `serde_json` without `arbitrary_precision` would have
/// parsed and then written it: an integer that fits `u64` or `i64` exactly, anything else as
/// the nearest double.
fn write_number_text(out: &mut Vec<u8>, text: &str) -> Result<(), CanonicalError> {
    if !text.contains(['.', 'e', 'E']) {
        if let Ok(v) = text.parse::<u64>() {
            return Canon { out, skip: &[] }.write_integer(v);
        }
        if let Ok(v) = text.parse::<i64>() {
            return Canon { out, skip: &[] }.write_integer(v);
        }
    }
    let v: f64 = text
        .parse()
        .map_err(|_| CanonicalError::Custom("a number's text is not a JSON number".into()))?;
    Canon { out, skip: &[] }.write_float(v, v.is_finite())
}

/// The one string a special struct's field holds.
fn special_text<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    match value.serialize(serde_json::value::Serializer) {
        Ok(serde_json::Value::String(text)) => Ok(text),
        _ => Err(CanonicalError::Custom(
            "a serde_json number or raw value that holds no text".into(),
        )),
    }
}

impl Object<'_, '_> {
    fn member<T: Serialize + ?Sized>(
        &mut self,
        name: Cow<'static, str>,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.members.add(name, value, self.skip)
    }

    fn finish(self) -> Result<(), CanonicalError> {
        if self.special.is_some() {
            // Written when its one field came.
            return Ok(());
        }
        self.members.write_to(self.out)?;
        if self.close_variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_, '_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), CanonicalError> {
        self.pending_key = Some(key.serialize(MapKey)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CanonicalError> {
        let name = self
            .pending_key
            .take()
            .ok_or_else(|| CanonicalError::Custom("map value without a key".into()))?;
        self.member(Cow::Owned(name), v)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeStruct for Object<'_, '_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        v: &T,
    ) -> Result<(), CanonicalError> {
        match self.special {
            Some(special) => special.write(self.out, &special_text(v)?, self.skip),
            None => self.member(Cow::Borrowed(name), v),
        }
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Object<'_, '_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        v: &T,
    ) -> Result<(), CanonicalError> {
        self.member(Cow::Borrowed(name), v)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

/// Map keys: strings as they are, integers and chars as their decimal / string form
/// (what `serde_json` does), anything else is an error.
struct MapKey;

impl MapKey {
    fn integer(v: impl itoa::Integer) -> Result<String, CanonicalError> {
        Ok(itoa::Buffer::new().format(v).to_owned())
    }
}

impl ser::Serializer for MapKey {
    type Ok = String;
    type Error = CanonicalError;
    type SerializeSeq = ser::Impossible<String, CanonicalError>;
    type SerializeTuple = ser::Impossible<String, CanonicalError>;
    type SerializeTupleStruct = ser::Impossible<String, CanonicalError>;
    type SerializeTupleVariant = ser::Impossible<String, CanonicalError>;
    type SerializeMap = ser::Impossible<String, CanonicalError>;
    type SerializeStruct = ser::Impossible<String, CanonicalError>;
    type SerializeStructVariant = ser::Impossible<String, CanonicalError>;

    fn serialize_str(self, v: &str) -> Result<String, CanonicalError> {
        Ok(v.to_owned())
    }
    fn serialize_char(self, v: char) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<String, CanonicalError> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, CanonicalError> {
        value.serialize(self)
    }
    fn serialize_i8(self, v: i8) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_i16(self, v: i16) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_i32(self, v: i32) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_i64(self, v: i64) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_i128(self, v: i128) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_u8(self, v: u8) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_u16(self, v: u16) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_u32(self, v: u32) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_u64(self, v: u64) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_u128(self, v: u128) -> Result<String, CanonicalError> {
        Self::integer(v)
    }
    fn serialize_bool(self, _v: bool) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_f32(self, _v: f32) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_f64(self, _v: f64) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_none(self) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_unit(self) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, CanonicalError> {
        Err(CanonicalError::NonStringKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: &serde_json::Value) -> String {
        String::from_utf8(to_canonical_json(v, &[]).unwrap()).unwrap()
    }

    #[test]
    fn rfc8785_section_3_2_2_example() {
        let input: serde_json::Value = serde_json::from_str(
            r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],
                "string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                "literals":[null,true,false]}"#,
        )
        .unwrap();
        assert_eq!(
            canon(&input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn rfc8785_sorting_example_orders_by_utf16_code_units() {
        let input: serde_json::Value = serde_json::from_str(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh",
                "1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
        )
        .unwrap();
        let out = canon(&input);
        let order: Vec<&str> = ["\\r", "1", "\u{80}", "ö", "€", "😀", "\u{fb33}"].to_vec();
        let mut last = 0;
        for name in order {
            let at = out.find(&format!("\"{name}\":")).expect(name);
            assert!(at >= last, "{name} out of order in {out}");
            last = at;
        }
    }

    proptest::proptest! {
        /// The byte shortcut orders names exactly as their UTF-16 code units do, over names
        /// that share prefixes and mix ASCII, the BMP above the surrogates and astral planes.
        #[test]
        fn names_compare_as_their_utf16_code_units(
            a in "[a\u{7f}\u{80}\u{7ff}\u{800}\u{e000}\u{ffff}\u{10000}\u{10ffff}]{0,4}",
            b in "[a\u{7f}\u{80}\u{7ff}\u{800}\u{e000}\u{ffff}\u{10000}\u{10ffff}]{0,4}",
        ) {
            proptest::prop_assert_eq!(compare_utf16(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
        }
    }

    #[test]
    fn integers_are_exact_beyond_two_to_the_53() {
        let a = to_canonical_json(&9_007_199_254_740_993_u64, &[]).unwrap();
        let b = to_canonical_json(&9_007_199_254_740_992_u64, &[]).unwrap();
        assert_eq!(a, b"9007199254740993");
        assert_ne!(a, b);
    }

    #[test]
    fn float_forms_match_integers_as_jcs_defines() {
        assert_eq!(to_canonical_json(&1.0_f64, &[]).unwrap(), b"1");
        assert_eq!(to_canonical_json(&1_u8, &[]).unwrap(), b"1");
        assert_eq!(to_canonical_json(&-0.0_f64, &[]).unwrap(), b"0");
        assert_eq!(to_canonical_json(&0.1_f32, &[]).unwrap(), b"0.1");
    }

    #[test]
    fn non_finite_floats_are_errors() {
        assert_eq!(
            to_canonical_json(&f64::NAN, &[]),
            Err(CanonicalError::NonFiniteNumber)
        );
        assert_eq!(
            to_canonical_json(&vec![f32::INFINITY], &[]),
            Err(CanonicalError::NonFiniteNumber)
        );
    }

    #[test]
    fn map_keys_must_be_strings_or_integers() {
        let mut ints = std::collections::HashMap::new();
        ints.insert(10_u32, "a");
        ints.insert(2_u32, "b");
        assert_eq!(
            to_canonical_json(&ints, &[]).unwrap(),
            br#"{"10":"a","2":"b"}"#
        );
        let mut tuples = std::collections::BTreeMap::new();
        tuples.insert((1, 2), "a");
        assert_eq!(
            to_canonical_json(&tuples, &[]),
            Err(CanonicalError::NonStringKey)
        );
    }

    #[test]
    fn skip_paths_leave_out_nested_members_only_where_named() {
        let v = json!({"req": {"trace_id": "t", "amount": 5}, "trace_id": "kept"});
        let out = to_canonical_json(&v, &[&["req", "trace_id"]]).unwrap();
        assert_eq!(out, br#"{"req":{"amount":5},"trace_id":"kept"}"#);
        let out = to_canonical_json(&v, &[&["trace_id"], &["nothing", "here"]]).unwrap();
        assert_eq!(out, br#"{"req":{"amount":5,"trace_id":"t"}}"#);
    }

    #[test]
    fn enums_use_the_external_tagging_of_serde_json() {
        #[derive(serde::Serialize)]
        enum E {
            Unit,
            New(u8),
            Tuple(u8, u8),
            Struct { b: u8, a: u8 },
        }
        let all = vec![E::Unit, E::New(1), E::Tuple(1, 2), E::Struct { b: 2, a: 1 }];
        assert_eq!(
            to_canonical_json(&all, &[]).unwrap(),
            br#"["Unit",{"New":1},{"Tuple":[1,2]},{"Struct":{"a":1,"b":2}}]"#
        );
    }

    #[test]
    fn duplicate_members_are_errors() {
        #[derive(serde::Serialize)]
        struct Inner {
            a: u8,
        }
        #[derive(serde::Serialize)]
        struct Outer {
            a: u8,
            #[serde(flatten)]
            inner: Inner,
        }
        assert!(matches!(
            to_canonical_json(&Outer { a: 1, inner: Inner { a: 2 } }, &[]),
            Err(CanonicalError::DuplicateMember(name)) if name == "a"
        ));
    }

    #[test]
    fn output_parses_back_to_the_same_document() {
        let v = json!({"b": [1, 2.5, "x\u{1}y"], "a": {"z": null, "y": true}, "c": "é\"\\"});
        let out = to_canonical_json(&v, &[]).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, v);
        assert_eq!(to_canonical_json(&back, &[]).unwrap(), out);
    }

    fn text(value: &impl serde::Serialize) -> String {
        String::from_utf8(to_canonical_json(value, &[]).unwrap()).unwrap()
    }

    /// The same JSON text gives the same canonical form whether or not some crate enabled
    /// `serde_json/arbitrary_precision` (CI runs these tests both ways): numbers are read back
    /// from their text as `serde_json` reads them without the feature.
    #[test]
    fn numbers_parsed_from_text_are_canonical_with_or_without_arbitrary_precision() {
        let parsed: serde_json::Value = serde_json::from_str(
            r#"[4.50, 1E30, 2e-3, 1.0, 100, 1e2, -0, -7, 18446744073709551615,
                18446744073709551616, -9223372036854775808, 123456789012345678901234567890,
                0.1, 5e-324]"#,
        )
        .unwrap();
        assert_eq!(
            text(&parsed),
            "[4.5,1e+30,0.002,1,100,100,0,-7,18446744073709551615,18446744073709552000,\
             -9223372036854775808,1.2345678901234568e+29,0.1,5e-324]"
        );
        assert_eq!(text(&json!({"n": 1.5, "m": 3})), r#"{"m":3,"n":1.5}"#);
    }

    /// A raw value is parsed and written canonical: its whitespace and member order, which a
    /// client library may change between retries, do not count.
    #[test]
    fn raw_values_are_canonicalized_not_hashed_as_text() {
        let a: Box<serde_json::value::RawValue> =
            serde_json::from_str(r#"{ "b" : [1.0, 2], "a": "x" }"#).unwrap();
        let b: Box<serde_json::value::RawValue> =
            serde_json::from_str(r#"{"a":"x","b":[1,2]}"#).unwrap();
        assert_eq!(text(&a), r#"{"a":"x","b":[1,2]}"#);
        assert_eq!(text(&a), text(&b));
        #[derive(serde::Serialize)]
        struct Call<'a> {
            id: u8,
            payload: &'a serde_json::value::RawValue,
        }
        assert_eq!(
            text(&Call { id: 1, payload: &a }),
            r#"{"id":1,"payload":{"a":"x","b":[1,2]}}"#
        );
    }

    /// Every corner of serde's data model has one pinned answer: canonical, or an error.
    #[test]
    fn serde_corners_are_pinned() {
        use std::collections::BTreeMap;
        // 128-bit integers, exact.
        assert_eq!(text(&u128::MAX), "340282366920938463463374607431768211455");
        assert_eq!(text(&i128::MIN), "-170141183460469231731687303715884105728");
        // Non-finite floats have no JSON form.
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                to_canonical_json(&v, &[]),
                Err(CanonicalError::NonFiniteNumber)
            );
        }
        assert_eq!(
            to_canonical_json(&f32::NAN, &[]),
            Err(CanonicalError::NonFiniteNumber)
        );
        // Maps: integer and char keys as text (sorted as text), other keys refused.
        let ints: BTreeMap<i64, &str> = [(10, "b"), (-1, "a"), (9, "c")].into();
        assert_eq!(text(&ints), r#"{"-1":"a","10":"b","9":"c"}"#);
        let chars: BTreeMap<char, u8> = [('z', 1), ('a', 2)].into();
        assert_eq!(text(&chars), r#"{"a":2,"z":1}"#);
        let bools: BTreeMap<bool, u8> = [(true, 1)].into();
        assert_eq!(
            to_canonical_json(&bools, &[]),
            Err(CanonicalError::NonStringKey)
        );
        let tuples: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert_eq!(
            to_canonical_json(&tuples, &[]),
            Err(CanonicalError::NonStringKey)
        );
        // Bytes: an array of numbers, as serde_json writes them.
        struct Bytes<'a>(&'a [u8]);
        impl serde::Serialize for Bytes<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        assert_eq!(text(&Bytes(&[0, 7, 255])), "[0,7,255]");
        assert_eq!(
            text(&Bytes(&[0, 7, 255])),
            serde_json::to_string(&Bytes(&[0, 7, 255])).unwrap()
        );
        // Newtypes: a struct is its content; a variant is tagged.
        #[derive(serde::Serialize)]
        struct Cents(u64);
        #[derive(serde::Serialize)]
        enum Amount {
            Cents(u64),
        }
        assert_eq!(text(&Cents(500)), "500");
        assert_eq!(text(&Amount::Cents(500)), r#"{"Cents":500}"#);
        // Untagged and internally tagged enums: what serde writes, sorted.
        #[derive(serde::Serialize)]
        #[serde(untagged)]
        enum Id {
            Number(u64),
            Named { name: String, zone: u8 },
        }
        assert_eq!(text(&Id::Number(7)), "7");
        assert_eq!(
            text(&Id::Named {
                zone: 2,
                name: "n".into()
            }),
            r#"{"name":"n","zone":2}"#
        );
        #[derive(serde::Serialize)]
        #[serde(tag = "kind")]
        enum Event {
            Charge { amount: u64 },
        }
        assert_eq!(
            text(&Event::Charge { amount: 5 }),
            r#"{"amount":5,"kind":"Charge"}"#
        );
        // Flatten: the members join the enclosing object, in canonical order.
        #[derive(serde::Serialize)]
        struct Meta {
            trace: u8,
        }
        #[derive(serde::Serialize)]
        struct Req {
            z: u8,
            #[serde(flatten)]
            meta: Meta,
        }
        assert_eq!(
            text(&Req {
                z: 1,
                meta: Meta { trace: 2 }
            }),
            r#"{"trace":2,"z":1}"#
        );
        // Unit, unit struct, none: null.
        #[derive(serde::Serialize)]
        struct Nothing;
        assert_eq!(text(&()), "null");
        assert_eq!(text(&Nothing), "null");
        assert_eq!(text(&None::<u8>), "null");
    }
}
