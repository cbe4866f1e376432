//! Deserializes a domain type that owns its serde format (the LR schedule) straight from the
//! located tree, with an error type that keeps serde's findings as data (which field is
//! unknown or missing, which variant is unknown) instead of as message text.

use std::fmt;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use super::tree::{Node, Val};

/// What serde found wrong.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeError {
    /// A key the type does not have; `expected` are the keys it has.
    UnknownField {
        field: String,
        expected: &'static [&'static str],
    },
    /// A required key that is absent.
    MissingField(&'static str),
    /// A tag naming no variant; `expected` are the variants.
    UnknownVariant {
        variant: String,
        expected: &'static [&'static str],
    },
    /// Anything else (a value of the wrong type or form), in serde's or the type's words.
    Other(String),
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeError::UnknownField { field, .. } => write!(f, "unknown field `{field}`"),
            DeError::MissingField(field) => write!(f, "missing field `{field}`"),
            DeError::UnknownVariant { variant, .. } => write!(f, "unknown variant `{variant}`"),
            DeError::Other(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::Other(msg.to_string())
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError::UnknownField {
            field: field.to_string(),
            expected,
        }
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::MissingField(field)
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        DeError::UnknownVariant {
            variant: variant.to_string(),
            expected,
        }
    }
}

/// A serde `Deserializer` over one node of the tree.
#[derive(Clone, Copy)]
pub(crate) struct NodeDe<'a>(pub &'a Node);

impl<'de> de::Deserializer<'de> for NodeDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.0.val {
            Val::Str(s) | Val::Datetime(s) => visitor.visit_str(s),
            Val::Int(i) => visitor.visit_i64(*i),
            Val::Float(f) => visitor.visit_f64(*f),
            Val::Bool(b) => visitor.visit_bool(*b),
            Val::Array(items) => {
                let mut seq = SeqDeserializer::new(items.iter().map(NodeDe));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Val::Table(t) => {
                let mut map = MapDeserializer::new(
                    t.entries.iter().map(|e| (e.key.as_str(), NodeDe(&e.node))),
                );
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de, 'a> IntoDeserializer<'de, DeError> for NodeDe<'a> {
    type Deserializer = NodeDe<'a>;

    fn into_deserializer(self) -> NodeDe<'a> {
        self
    }
}
