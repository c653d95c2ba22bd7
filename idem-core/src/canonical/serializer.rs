//! The serializer: any `Serialize` value written straight as canonical JSON. Objects gather
//! their members ([`Members`]) and are written sorted once complete; a member's value is
//! serialized by the same serializer, so the two recurse into each other and live together.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Range;

use serde::ser::{self, Serialize};

use super::error::CanonicalError;
use super::map_key::MapKey;
use super::text::{compare_utf16, write_object, write_str};

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
