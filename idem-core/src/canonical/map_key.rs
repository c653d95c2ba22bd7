//! Map keys: strings as they are, integers and chars as their text, anything else an error.

use serde::ser::{self, Serialize};

use super::error::CanonicalError;

/// Map keys: strings as they are, integers and chars as their decimal / string form
/// (what `serde_json` does), anything else is an error.
pub(super) struct MapKey;

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
